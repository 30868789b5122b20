"""The reasoning-gym adapter against the real package (harmonyrl[reasoning-gym], installed by the ``test`` extra).

The grader attacks: reasoning-gym's own ``score_answer`` pays for answers that say nothing (its default pays
``len(reference) / len(answer)`` to any answer containing the reference, so an echoed question with the answer
appended earns a little, and ``power_function`` scores an empty answer 0.01). Each test below first shows the raw
scorer paying (so the attack is real, not assumed) and then the adapter scoring it 0.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from harmonyrl.envs.checker import check_env, errors
from harmonyrl.envs.loader import UserCodeError
from harmonyrl.rollout.curriculum import Curriculum, CurriculumConfig
from harmonyrl.tasks.ecosystems import packages
from harmonyrl.tasks.ecosystems.guard import default_max_chars
from harmonyrl.tasks.ecosystems.reasoning_gym import ReasoningGymFactory, expert_demo, wrong_answer
from harmonyrl.tasks.ecosystems.reasoning_gym_config import P_TOOL, P_VERBOSE, ReasoningGymEnvConfig
from harmonyrl.types import Message, StepResult, Task

rg = pytest.importorskip(
    "reasoning_gym", reason="reasoning-gym is not installed (pip install 'harmonyrl[reasoning-gym]')"
)


def small(*tasks: str, **kw: object) -> ReasoningGymFactory:
    return ReasoningGymFactory(list(tasks), seed=0, n_train=40, n_val=10, n_test=10, **kw)  # type: ignore[arg-type]


def answer(factory: ReasoningGymFactory, task: Task, text: str) -> StepResult:
    async def episode() -> StepResult:
        env = factory.make(task)
        await env.reset()
        return await env.step([Message("assistant", text, channel="final")])

    return asyncio.run(episode())


def test_the_splits_are_disjoint_deterministic_and_sized() -> None:
    f, again = small("chain_sum", "word_sequence_reversal"), small("chain_sum", "word_sequence_reversal")
    splits = {s: f.tasks(s) for s in ("train", "validation", "test")}
    assert [len(v) for v in splits.values()] == [40, 10, 10]
    prompts = {s: {t.prompt for t in v} for s, v in splits.items()}
    assert not prompts["train"] & prompts["validation"] and not prompts["train"] & prompts["test"]
    assert not prompts["validation"] & prompts["test"]
    assert f.tasks("test") == again.tasks("test") and f.tasks("train") == again.tasks("train")
    assert {f.entry(t)[0] for t in f.tasks("train")} == {"chain_sum", "word_sequence_reversal"}
    other_seed = ReasoningGymFactory(["chain_sum"], seed=1, n_train=40, n_val=10, n_test=10)
    assert {t.prompt for t in other_seed.tasks("train")} != {t.prompt for t in small("chain_sum").tasks("train")}


def test_each_task_carries_its_split() -> None:
    f = small("chain_sum")
    assert all(t.split == split for split in ("train", "validation", "test") for t in f.tasks(split))


def test_weights_set_the_mix() -> None:
    f = ReasoningGymFactory(["chain_sum", "spell_backward"], [9, 1], seed=0, n_train=200, n_val=0, n_test=1)
    counts = [sum(f.entry(t)[0] == name for t in f.tasks("train")) for name in ("chain_sum", "spell_backward")]
    assert counts[0] > 5 * counts[1] > 0


def test_the_reference_scores_1_and_a_wrong_answer_0() -> None:
    f = small("chain_sum", "word_sequence_reversal")
    for task in f.tasks("test")[:6]:
        right = answer(f, task, task.answer)
        assert right.reward == 1.0 and right.info["correct"] == 1.0 and right.terminated
        wrong = answer(f, task, wrong_answer(task.answer, random.Random(0)))
        assert wrong.reward < 1.0 and wrong.info["correct"] == 0.0


def test_an_echoed_question_scores_nothing() -> None:
    f = small("word_sequence_reversal")
    task = f.tasks("test")[0]
    name, entry = f.entry(task)
    echo = f"{task.prompt} {task.answer}"
    assert rg.get_score_answer_fn(name)(echo, entry) > 0  # the raw scorer pays for it
    result = answer(f, task, echo)
    assert result.reward == 0.0 and result.info["guarded"] == 1.0 and result.info["correct"] == 0.0


def test_an_empty_answer_scores_nothing_even_where_the_task_pays_for_it() -> None:
    f = small("power_function")
    task = f.tasks("test")[0]
    assert rg.get_score_answer_fn("power_function")("", f.entry(task)[1]) > 0  # reasoning-gym pays 0.01
    for text in ("", "   ", "\n"):
        result = answer(f, task, text)
        assert result.reward == 0.0 and result.info["guarded"] == 1.0


def test_an_over_long_answer_listing_candidates_scores_nothing() -> None:
    f = small("word_sequence_reversal")
    task = f.tasks("test")[0]
    words = task.answer.split(", ")
    spray = " | ".join([task.answer, ", ".join(words[::-1]), *words] * 4)
    assert len(spray) > default_max_chars(task.answer)
    assert rg.get_score_answer_fn("word_sequence_reversal")(spray, f.entry(task)[1]) > 0
    assert answer(f, task, spray).reward == 0.0
    capped = small("word_sequence_reversal", max_answer_chars=3)
    assert answer(capped, capped.tasks("test")[0], task.answer).reward == 0.0


def test_no_final_answer_is_a_format_error_and_a_tool_call_an_observation() -> None:
    f = small("chain_sum")
    task = f.tasks("test")[0]

    async def episode() -> tuple[StepResult, StepResult]:
        env = f.make(task)
        await env.reset()
        call = Message("assistant", "{}", channel="commentary", recipient="functions.calc", content_type="json")
        tool = await env.step([call])
        return tool, await env.step([Message("assistant", task.answer, channel="analysis")])

    tool, unanswered = asyncio.run(episode())
    assert tool.observations and not tool.terminated and tool.failure is None
    assert unanswered.reward == 0.0 and unanswered.info["format_error"] == 1.0


def test_a_scorer_that_raises_on_an_answer_scores_it_0_not_a_masked_fault(monkeypatch: pytest.MonkeyPatch) -> None:
    f = small("chain_sum")
    task = f.tasks("test")[0]
    dataset = f._datasets["chain_sum"]

    def boom(answer: str, entry: object) -> float:
        raise ValueError("cannot parse")

    monkeypatch.setattr(dataset, "score_answer", boom)
    result = answer(f, task, task.answer)
    assert result.reward == 0.0 and result.failure is None and result.info["grader_error"] == 1.0


def test_levels_follow_the_tasks_curriculum_and_feed_rl_curriculum() -> None:
    f = ReasoningGymEnvConfig(tasks=("chain_sum",), levels=(0, 3), n_train=60, n_test=8).build_factory(seed=0)
    train = f.tasks("train")
    levels = [f.difficulty(t) for t in train]
    assert set(levels) == {0, 1, 2, 3}
    terms = {lvl: {f.entry(t)[1]["metadata"]["num_terms"] for t in train if f.difficulty(t) == lvl} for lvl in (0, 3)}
    assert terms[0] == {2} and min(terms[3]) > 2  # level L: the curriculum's L-th band of terms
    curriculum = Curriculum(train, f.difficulty, CurriculumConfig(start_levels=1), seed=0)
    assert {f.difficulty(t) for t in curriculum.draw(0, 16)} == {0}
    assert small("chain_sum").difficulty(small("chain_sum").tasks("train")[0]) is None


def test_the_expert_demonstrates_the_reference_imperfectly() -> None:
    f = small("chain_sum", "word_sequence_reversal")
    rng = random.Random(0)
    for task in f.tasks("train")[:10]:
        (msg,) = expert_demo(task, rng, p_tool=1.0, p_verbose=0.0)
        assert answer(f, task, msg.content).reward == 1.0
    demos = [expert_demo(t, rng)[0].content for t in f.tasks("train")]
    exact = sum(d == t.answer for d, t in zip(demos, f.tasks("train"), strict=True))
    assert 0 < exact < len(demos)  # the deliberate imperfections leave RL something to learn
    with pytest.raises(UserCodeError, match="no reference answer"):
        expert_demo(Task("x", "q", "", "train"), rng)


def test_wrong_answers_keep_the_shape_and_differ() -> None:
    rng = random.Random(1)
    for ref in ("42", "-7", "may, free", "htob", "a"):
        guess = wrong_answer(ref, rng)
        assert guess != ref
    assert wrong_answer("1234", rng).lstrip("-").isdigit()


def test_the_factory_passes_check_env() -> None:
    assert errors(check_env(small("chain_sum", "word_sequence_reversal"), n_tasks=3)) == []


def test_the_expert_defaults_are_the_built_in_ones() -> None:
    import inspect

    from harmonyrl.tasks import config

    assert (P_TOOL, P_VERBOSE) == (config.P_TOOL, config.P_VERBOSE)
    defaults = inspect.signature(expert_demo).parameters
    assert (defaults["p_tool"].default, defaults["p_verbose"].default) == (P_TOOL, P_VERBOSE)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tasks": ("chain_sun",)}, "'chain_sun' is not a reasoning-gym .* task .did you mean chain_sum"),
        ({"tasks": ("composite",)}, "reasoning-gym's own mixer"),
        ({"tasks": ("chain_sum",), "config": {"chain_sum": {"max_term": 3}}}, "has no knob 'max_term' .it has: "),
        ({"tasks": ("chain_sum",), "config": {"chain_sum": {"seed": 3}}}, "chain_sum.seed is set by harmonyrl"),
        ({"tasks": ("chain_sum",), "config": {"chain_sum": {"max_terms": 0}}}, "refuses these knobs: AssertionError"),
        ({"tasks": ("chain_sum",), "config": {"gcd": {"x": 1}}}, "env.config.gcd: 'gcd' is not in env.tasks"),
        ({"tasks": ("chain_sum",), "weights": (1.0, 2.0)}, "env.weights must be 1 positive numbers"),
        ({"tasks": ("chain_sum",), "levels": (0, 99)}, "env.levels must be"),
        ({"tasks": ("chain_sum",), "levels": (0, 1), "config": {"chain_sum": {"max_terms": 3}}}, "set by env.levels"),
        ({"tasks": ("chain_sum",), "package_version": "0.0.1"}, "this run was made with reasoning-gym 0.0.1"),
    ],
)
def test_bad_config_is_one_line(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        ReasoningGymEnvConfig(**kwargs)  # type: ignore[arg-type]
    assert len([line for line in str(caught.value).splitlines() if message.split(" ")[0] in line]) == 1


def test_a_missing_package_is_one_line_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> object:
        raise ModuleNotFoundError(f"No module named '{name}'")

    monkeypatch.setattr(packages.importlib, "import_module", missing)
    with pytest.raises(UserCodeError, match=r"pip install 'harmonyrl\[reasoning-gym\]'") as caught:
        packages.require("reasoning_gym", "reasoning-gym", "reasoning-gym")
    assert "\n" not in str(caught.value)


def test_the_config_records_the_package_version() -> None:
    import importlib.metadata

    recorded = ReasoningGymEnvConfig(tasks=("chain_sum",)).package_version
    assert recorded == importlib.metadata.version("reasoning-gym")


def test_the_run_config_reads_the_command_line_form() -> None:
    from harmonyrl.config import load_config
    from harmonyrl.tasks.factory import expert_for, make_factory

    overrides = ["env.name=reasoning_gym", "env.tasks=[chain_sum,letter_counting]", "env.weights=[3,1]",
                 "env.config.chain_sum.max_terms=2", "env.n_train=20", "env.n_val=4", "env.n_test=4"]  # fmt: skip
    env = load_config(None, overrides).env
    assert env.tasks == ("chain_sum", "letter_counting") and env.config == {"chain_sum": {"max_terms": 2}}
    factory = make_factory(env, seed=0)
    task = factory.tasks("train")[0]
    (demo,) = expert_for(env.model_copy(update={"p_tool": 1.0, "p_verbose": 0.0}))(task, random.Random(0))
    assert demo.content == task.answer


def test_rl_curriculum_opens_levels_of_a_levelled_reasoning_gym_env() -> None:
    from harmonyrl.config import load_config

    base = ["env.name=reasoning_gym", "env.tasks=[chain_sum]", "rl.curriculum.start_levels=1"]
    cfg = load_config(None, [*base, "env.levels=[0,2]", "rl.curriculum.widen_every=5"])
    assert cfg.rl.curriculum is not None and cfg.rl.curriculum.start_levels == 1
    with pytest.raises(ValueError, match=r"env\.levels for the calculator or reasoning_gym"):
        load_config(None, base)


@pytest.mark.parametrize(
    ("name", "fields"),
    [
        ("reasoning_gym", "env.tasks=[chain_sum]"),
        ("verifiers", "env.id=vf_sum"),
        ("textarena", "env.game=GuessTheNumber-v0"),
    ],
)
def test_a_run_made_with_another_package_version_is_one_line(name: str, fields: str) -> None:
    """Every ecosystem config records its package's version and refuses another (a resume or eval elsewhere)."""
    from harmonyrl.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"this run was made with \S+ 0\.0\.1, but \S+ is installed"):
        load_config(None, [f"env.name={name}", fields, "env.package_version=0.0.1"])
