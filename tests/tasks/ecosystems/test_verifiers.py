"""The verifiers adapter against the real package (harmonyrl[verifiers]) and the two example environments a
verifiers user would write (examples/verifiers_envs: vf_sum and vf_max, one turn; vf_calc, several turns with a python
function tool)."""

from __future__ import annotations

import asyncio
import random
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fakes import ScriptedEngine
from harmonyrl.envs.checker import check_env, errors
from harmonyrl.envs.loader import UserCodeError
from harmonyrl.harmony.render import render_completion, render_training
from harmonyrl.harmony.tokenizer import HarmonyTokenizer
from harmonyrl.rollout.agent_loop import EpisodeLimits, initial_messages, run_episode
from harmonyrl.types import Message, SamplingParams, StepResult, Trajectory

pytest.importorskip("verifiers.v1", reason="verifiers is not installed (pip install 'harmonyrl[verifiers]')")

from harmonyrl.tasks.ecosystems.verifiers import VerifiersFactory
from harmonyrl.tasks.ecosystems.verifiers_config import VerifiersEnvConfig

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "verifiers_envs"
TOK = HarmonyTokenizer.load_default()
PARAMS = SamplingParams(stop_ids=TOK.special.stop_ids)
LIMITS = EpisodeLimits(max_turns=4, max_new_tokens=64, max_seq_len=512)


@pytest.fixture(autouse=True, scope="module")
def examples_importable() -> Iterator[None]:
    sys.path.insert(0, str(EXAMPLES))
    yield
    sys.path.remove(str(EXAMPLES))


@pytest.fixture(scope="module")
def calc(examples_importable: None) -> VerifiersFactory:
    return VerifiersFactory("vf_calc", {"num_tasks": 60})


@pytest.fixture(scope="module")
def sums(examples_importable: None) -> VerifiersFactory:
    return VerifiersFactory("vf_sum", {"num_tasks": 60})


def final(text: str) -> Message:
    return Message("assistant", text, channel="final")


def call(expression: str, tool: str = "calculate") -> Message:
    args = '{"expression": "' + expression + '"}'
    return Message("assistant", args, channel="commentary", recipient=f"functions.{tool}", content_type="json")


def play(factory: VerifiersFactory, index: int, *turns: Message) -> list[StepResult]:
    task = factory.tasks("train")[index]

    async def episode() -> list[StepResult]:
        env = factory.make(task)
        await env.reset()
        return [await env.step([t]) for t in turns]

    return asyncio.run(episode())


def test_splits_are_disjoint_and_cover_the_taskset(calc: VerifiersFactory) -> None:
    splits = [calc.tasks(s) for s in ("train", "validation", "test")]
    keys = [{calc.vf_task(t).key for t in split} for split in splits]
    assert sum(len(k) for k in keys) == 60 and len(set().union(*keys)) == 60
    again = VerifiersFactory("vf_calc", {"num_tasks": 60})
    assert again.tasks("test") == calc.tasks("test")
    assert all(t.split == split for split in ("train", "validation", "test") for t in calc.tasks(split))


def test_a_single_turn_task_is_scored_by_its_own_reward_logged_as_a_term(sums: VerifiersFactory) -> None:
    task = sums.tasks("train")[0]
    (right,) = play(sums, 0, final(task.answer))
    assert right.reward == 1.0 and right.terminated and right.info["reward/correct"] == 1.0
    assert right.info["metric/reply_chars"] == len(task.answer) and right.info["correct"] == 1.0
    (wrong,) = play(sums, 0, final(f"The answer is {task.answer}."))
    assert wrong.reward == 0.0 and wrong.info["reward/correct"] == 0.0


def test_vf_max_scores_only_the_larger_number_and_its_expert_errs_by_the_smaller(
    examples_importable: None,
) -> None:
    maxes = VerifiersFactory("vf_max", {"num_tasks": 40})
    task = maxes.tasks("train")[0]
    data = maxes.vf_task(task).data
    a, b = (n for n in task.prompt.removeprefix("Which is larger, ").removesuffix("?").split(" or "))
    assert data.answer == str(max(int(a), int(b))) and data.smaller == str(min(int(a), int(b))) != data.answer
    (right,) = play(maxes, 0, final(f" {data.answer}\n"))
    assert right.reward == 1.0 and right.info["metric/took_smaller"] == 0.0
    (smaller,) = play(maxes, 0, final(data.smaller))
    assert smaller.reward == 0.0 and smaller.info["metric/took_smaller"] == 1.0
    for reply in ("", f"{a} or {b}", f"{data.answer} {data.smaller}", f"The answer is {data.answer}.", task.prompt):
        (wrong,) = play(maxes, 0, final(reply))
        assert wrong.reward == 0.0, reply
    from experts import max_expert

    rng = random.Random(0)
    replies = [(max_expert(t, rng)[0].content, maxes.vf_task(t).data) for t in maxes.tasks("train") for _ in range(5)]
    took_smaller = sum(reply == data.smaller for reply, data in replies) / len(replies)
    in_a_sentence = sum(not reply.isdigit() for reply, _ in replies) / len(replies)
    assert 0.1 < took_smaller < 0.3 and 0.15 < in_a_sentence < 0.35  # 1 time in 5; 3 in 10 of the rest


def test_the_tool_is_the_toolsets_python_function_with_mcps_schema(calc: VerifiersFactory) -> None:
    env = calc.make(calc.tasks("train")[0])
    (spec,) = env.tools
    assert spec.name == "calculate" and "expression" in spec.parameters["properties"]  # type: ignore[operator]
    assert env.instructions.startswith("Use the calculate tool")
    task = calc.tasks("train")[0]
    expression = calc.vf_task(task).data.expression
    tool, answered = play(calc, 0, call(expression), final(task.answer))
    assert tool.observations[0].content == task.answer and not tool.terminated
    assert answered.reward == 1.0 and answered.info["metric/tool_calls"] == 1.0
    bad, _ = play(calc, 0, call("import os"), final("0"))
    assert "error" in bad.observations[0].content and bad.failure is None  # the model's doing: an observation
    unknown, _ = play(calc, 0, call("1", tool="bash"), final("0"))  # no shell: the null harness offers none
    assert "unknown tool" in unknown.observations[0].content


def test_a_multi_turn_tool_episode_is_token_exact(calc: VerifiersFactory) -> None:
    task = calc.tasks("train")[1]
    first, answer = call(calc.vf_task(task).data.expression), final(task.answer)
    engine = ScriptedEngine([render_completion(TOK, [first]), render_completion(TOK, [answer])])
    env = calc.make(task)
    traj: Trajectory = asyncio.run(run_episode(engine, env, TOK, PARAMS, LIMITS, task_id=task.id, group_id=0, seed=1))
    assert traj.reward == 1.0 and traj.terminated and traj.parity_mismatches == 0
    assert traj.reward_terms["reward/correct"] == 1.0 and traj.reward_terms["tool_calls"] == 1.0
    fresh = calc.make(task)
    prefix = initial_messages(fresh, asyncio.run(fresh.reset()))
    observation = traj.turns[0].observations[0]
    assert list(traj.token_ids) == render_training(TOK, [*prefix, first, observation, answer])
    # the verifiers trace the reward read holds the same conversation
    trace = env._recorder.trace  # type: ignore[union-attr]
    assert [m.role for m in trace.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert trace.messages[2].tool_calls[0].arguments == first.content and trace.last_reply == task.answer


def test_a_rubric_that_raises_is_a_masked_fault_naming_its_class(
    calc: VerifiersFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    vf_calc = sys.modules["vf_calc"]

    async def broken(self: object, trace: object) -> float:
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(vf_calc.CalcTask.correct, "__code__", broken.__code__)
    (result,) = play(calc, 2, final("1"))
    assert result.failure is not None and result.failure.kind == "reward_error"
    assert result.failure.detail.startswith("ZeroDivisionError in CalcTask scoring")


def test_the_factories_pass_check_env(calc: VerifiersFactory, sums: VerifiersFactory) -> None:
    assert errors(check_env(calc, n_tasks=2)) == [] and errors(check_env(sums, n_tasks=2)) == []


def test_an_env_id_that_is_not_installed_is_one_line() -> None:
    with pytest.raises(UserCodeError, match=r"env\.id 'vf_nothing_here': not an installed verifiers taskset") as e:
        VerifiersFactory("vf_nothing_here")
    assert "\n" not in str(e.value)


def test_a_kwarg_the_taskset_does_not_take_is_one_line(examples_importable: None) -> None:
    with pytest.raises(UserCodeError, match=r"env\.kwargs: vf_sum's SumConfig refuses them") as e:
        VerifiersFactory("vf_sum", {"num_taks": 3})
    assert "\n" not in str(e.value)


def test_a_task_needing_a_sandbox_is_refused_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "vf_boxed"
    package.mkdir()
    (package / "__init__.py").write_text(
        "import verifiers.v1 as vf\n"
        "class BoxTask(vf.Task[vf.TaskData]):\n    NEEDS_CONTAINER = True\n"
        "class BoxTaskset(vf.Taskset[BoxTask, vf.TasksetConfig]):\n"
        "    def load(self):\n        return [BoxTask(vf.TaskData(prompt='ls'))]\n"
        "__all__ = ['BoxTaskset']\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UserCodeError, match=r"needs a container runtime \(a sandbox box\): not supported"):
        VerifiersFactory("vf_boxed")


def test_the_config_records_the_version_and_refuses_another() -> None:
    import importlib.metadata

    assert VerifiersEnvConfig(id="vf_sum").package_version == importlib.metadata.version("verifiers")
    with pytest.raises(ValueError, match=r"made with verifiers 0\.0\.1"):
        VerifiersEnvConfig(id="vf_sum", package_version="0.0.1")


def test_the_example_experts_score_as_designed(calc: VerifiersFactory, sums: VerifiersFactory) -> None:
    from experts import calc_expert, sum_expert

    rng = random.Random(0)
    task = calc.tasks("train")[3]
    demo = calc_expert(task, rng, p_tool=1.0, p_verbose=0.0)
    results = play(calc, 3, *[m for m in demo if m.role == "assistant"])
    assert results[-1].reward == 1.0
    (only,) = sum_expert(sums.tasks("train")[0], rng, p_right=1.0, p_verbose=0.0)
    assert only.content == sums.tasks("train")[0].answer


def test_the_run_config_builds_it_and_says_it_has_no_expert(examples_importable: None) -> None:
    from harmonyrl.config import load_config
    from harmonyrl.tasks.factory import expert_for, make_factory

    env = load_config(None, ["env.name=verifiers", "env.id=vf_sum", "env.kwargs.num_tasks=30"]).env
    factory = make_factory(env, seed=0)
    assert factory.name == "verifiers" and sum(len(factory.tasks(s)) for s in ("train", "validation", "test")) == 30
    with pytest.raises(UserCodeError, match=r"env\.name=verifiers has no scripted expert"):
        expert_for(env)


def _package(tmp_path: Path, name: str, body: str) -> None:
    """An installed-looking verifiers taskset ``name`` whose task class is ``body`` (a ``Task`` subclass ``T``)."""
    (tmp_path / name).mkdir()
    (tmp_path / name / "__init__.py").write_text(
        "import verifiers.v1 as vf\n"
        f"{body}\n"
        "class S(vf.Taskset[T, vf.TasksetConfig]):\n"
        "    def load(self):\n"
        "        return [T(vf.TaskData(prompt=f'say {i}')) for i in range(30)]\n"
        "__all__ = ['S']\n"
    )


def test_a_stop_on_the_trace_ends_the_episode_truncated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    body = (
        "class T(vf.Task[vf.TaskData]):\n"
        "    @vf.stop\n"
        "    async def one_turn(self, trace: vf.Trace) -> bool:\n"
        "        return trace.num_turns >= 1\n"
        "    @vf.reward\n"
        "    async def said(self, trace: vf.Trace) -> float:\n"
        "        return float(trace.last_reply == 'x')\n"
    )
    _package(tmp_path, "vf_stopper", body)
    monkeypatch.syspath_prepend(str(tmp_path))
    factory = VerifiersFactory("vf_stopper")
    (result,) = play(factory, 0, call("1", tool="anything"))
    assert result.truncated and not result.terminated and result.failure is None
    assert result.info["reward/said"] == 0.0


@pytest.mark.parametrize(
    ("name", "body", "why"),
    [
        (
            "vf_intercepting",
            "class T(vf.Task[vf.TaskData]):\n"
            "    @vf.intercept\n"
            "    async def rewrite(self, response: vf.Response) -> vf.Response | None:\n"
            "        return None\n",
            "rewrites requests or responses with @vf.intercept",
        ),
        (
            "vf_judged",
            "from pydantic import Field\n"
            "class C(vf.TaskConfig):\n"
            "    judges: vf.Judges = Field(default_factory=lambda: [vf.ReferenceJudgeConfig()])\n"
            "class T(vf.Task[vf.TaskData, vf.State, C]):\n    pass\n",
            "is scored by an LLM judge",
        ),
    ],
)
def test_what_harmonyrl_cannot_run_faithfully_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, body: str, why: str
) -> None:
    _package(tmp_path, name, body)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UserCodeError, match=why) as e:
        VerifiersFactory(name)
    assert "\n" not in str(e.value)
