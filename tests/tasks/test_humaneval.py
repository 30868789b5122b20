"""HumanEval env: the shipped problems and their split, what a submission may be, grading in the real sandbox,
and who is blamed when something goes wrong (the code: reward 0; the grader: a masked failure)."""

from __future__ import annotations

import asyncio
import functools
import json
import random
import time
from collections.abc import Sequence

import pytest

import harmonyrl.tasks.humaneval as he
import harmonyrl.tasks.humaneval_grader as hg
from harmonyrl.envs.checker import assert_env_ok
from harmonyrl.envs.reward import RewardWeights
from harmonyrl.sandbox import SandboxLimits, SandboxResult, SandboxUnavailable, run_python
from harmonyrl.tasks.humaneval import (
    VERBOSE_PREFIX,
    HumanEvalEnv,
    HumanEvalFactory,
    broken_solution,
    expert_demo,
    extract_code,
    problems,
    solution_program,
    split_tasks,
)
from harmonyrl.types import Failure, Message, StepResult, Task

FAST = SandboxLimits(timeout_s=1, cpu_s=1, memory_mib=256, max_processes=16, max_output_bytes=4096)
TRAIN, VAL, TEST = split_tasks()
BY_ID = {t.id: t for t in (*TRAIN, *VAL, *TEST)}


def small() -> HumanEvalFactory:
    return HumanEvalFactory(n_train=5, n_test=2, tool_limits=FAST, grader_limits=FAST)


@pytest.fixture(scope="module")
def factory() -> HumanEvalFactory:
    """Only the tests that run code need bubblewrap; elsewhere they skip with the measured cause."""
    try:
        return small()
    except SandboxUnavailable as e:
        pytest.skip(f"bubblewrap cannot sandbox on this machine: {e}")


def final(content: str) -> list[Message]:
    return [Message("assistant", content, channel="final")]


def play(factory: HumanEvalFactory, task: Task, actions: Sequence[Sequence[Message]]) -> list[StepResult]:
    async def go() -> list[StepResult]:
        env: HumanEvalEnv = factory.make(task)
        await env.reset()
        return [await env.step(a) for a in actions]

    return asyncio.run(go())


def submit(factory: HumanEvalFactory, task_id: str, content: str) -> StepResult:
    [result] = play(factory, BY_ID[task_id], [final(content)])
    assert result.terminated and result.failure is None
    return result


def test_all_164_problems_load_and_split_104_20_40() -> None:
    assert len(problems()) == 164 and (len(TRAIN), len(VAL), len(TEST)) == (104, 20, 40)
    assert {t.id for t in (*TRAIN, *VAL, *TEST)} == set(problems()) == {f"HumanEval/{i}" for i in range(164)}
    assert [t.id for t in TEST[:4]] == ["HumanEval/1", "HumanEval/11", "HumanEval/17", "HumanEval/20"]  # unchanged
    assert [t.id for t in TRAIN[:3]] == ["HumanEval/0", "HumanEval/2", "HumanEval/3"]
    assert {t.split for t in VAL} == {"validation"} and not {t.id for t in VAL} & {t.id for t in TRAIN}
    p = problems()["HumanEval/0"]
    assert (BY_ID[p.task_id].prompt, BY_ID[p.task_id].answer) == (p.prompt, p.canonical_solution)
    assert split_tasks(3, 2, 1) == (TRAIN[:3], VAL[:1], TEST[:2])
    with pytest.raises(ValueError, match="104 train, 20 validation and 40 test"):
        split_tasks(105, 40)


def test_check_env_passes(factory: HumanEvalFactory) -> None:
    assert_env_ok(factory, rebuild=small)


@pytest.mark.parametrize("task_id", ["HumanEval/0", "HumanEval/10", "HumanEval/32", "HumanEval/38", "HumanEval/1"])
def test_canonical_solutions_pass(factory: HumanEvalFactory, task_id: str) -> None:
    # 10, 32 and 38 call helper functions defined in the prompt; HumanEval/1 is a held-out problem
    result = submit(factory, task_id, BY_ID[task_id].answer)
    assert (result.reward, result.info["correct"], result.info["syntax_error"]) == (1.0, 1.0, 0.0)


@pytest.mark.slow
def test_every_canonical_solution_passes_the_grader_and_broken_twins_fail() -> None:
    """All 164 with the default grader limits (``pytest -m slow``): every reference solution is accepted, and
    every operator-flipped twin is rejected except the three whose tests never reach the flipped branch."""
    try:
        full = HumanEvalFactory(n_train=104, n_test=40)  # with its 20 validation problems: all 164
    except SandboxUnavailable as e:
        pytest.skip(f"bubblewrap cannot sandbox on this machine: {e}")
    failed = [t.id for t in (*TRAIN, *VAL, *TEST) if submit(full, t.id, t.answer).reward != 1.0]
    assert failed == []
    broken = {t.id: broken_solution(problems()[t.id]) for t in (*TRAIN, *VAL, *TEST)}
    accepted = [i for i, code in broken.items() if code != BY_ID[i].answer and submit(full, i, code).reward != 0.0]
    assert set(accepted) == {"HumanEval/18", "HumanEval/40", "HumanEval/129"}


def test_broken_solutions_fail(factory: HumanEvalFactory) -> None:
    for task_id in ("HumanEval/0", "HumanEval/2", "HumanEval/53"):
        result = submit(factory, task_id, broken_solution(problems()[task_id]))
        assert (result.reward, result.info["correct"], result.info["tests_timeout"]) == (0.0, 0.0, 0.0)
    assert broken_solution(problems()["HumanEval/53"]) == "    return x - y\n"
    assert broken_solution(problems()["HumanEval/2"]) == "    return None\n"  # no operator to flip


def test_infinite_loop_is_the_models_zero_not_a_failure(factory: HumanEvalFactory) -> None:
    start = time.monotonic()
    result = submit(factory, "HumanEval/53", "    while True:\n        pass\n")
    assert (result.reward, result.info["correct"], result.info["tests_timeout"]) == (0.0, 0.0, 1.0)
    assert time.monotonic() - start < 1 + 5  # the 1 s wall-clock limit, plus sandbox start-up on a busy machine


@pytest.mark.parametrize(
    "body",
    [
        "    class Any:\n        def __eq__(self, other):\n            return True\n    return Any()\n",
        "    class Int(int):\n        def __eq__(self, other):\n            return True\n    return Int(0)\n",
        # a metaclass whose classes equal every type: the guard compares types by identity, not ==
        "    class Meta(type):\n        def __eq__(cls, other):\n            return True\n"
        "        __hash__ = type.__hash__\n"
        "    class Fake(metaclass=Meta):\n        def __eq__(self, other):\n            return True\n"
        "    return Fake()\n",
    ],
)
def test_objects_that_equal_anything_do_not_pass(factory: HumanEvalFactory, body: str) -> None:
    result = submit(factory, "HumanEval/53", body)  # add(x, y): every assert compares with ==
    assert (result.reward, result.info["correct"], result.info["syntax_error"]) == (0.0, 0.0, 0.0)


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ("    print('x' * 10**6)\n    return x + y\n", "output_limit"),  # an output bomb
        ("    b = bytearray(2**34)\n    return x + y\n", "error"),  # a memory bomb: MemoryError
        ("    raise RuntimeError('no')\n", "error"),
        ("    return x * y\n", "wrong"),  # plain wrong: an assert fails in the checker
    ],
)
def test_what_the_code_does_is_the_models_zero(
    factory: HumanEvalFactory, monkeypatch: pytest.MonkeyPatch, body: str, status: str
) -> None:
    seen: list[str] = []
    real = he.grade

    async def spy(*args: object, **kwargs: object) -> he.Grade:
        result = await real(*args, **kwargs)  # type: ignore[arg-type]
        seen.append(result.status)
        return result

    monkeypatch.setattr(he, "grade", spy)
    result = submit(factory, "HumanEval/53", body)
    assert (result.reward, result.info["correct"], result.info["syntax_error"], seen) == (0.0, 0.0, 0.0, [status])


def test_exiting_before_the_tests_does_not_pass(factory: HumanEvalFactory) -> None:
    for body in ("    import sys\n    sys.exit(0)\n", "    import os\n    os._exit(0)\n"):
        assert submit(factory, "HumanEval/53", body).reward == 0.0
    assert submit(factory, "HumanEval/53", "import sys\nsys.exit(0)\ndef add(x, y):\n    return x + y\n").reward == 0.0


ADD = "def add(x: int, y: int):\n    return x + y\n"


@pytest.mark.parametrize(
    "content",
    [
        "    return x + y",  # the canonical form: a body continuing the prompt
        "return x + y\n",  # a body without indentation
        ADD,  # a full function
        f"from typing import List\n\n\n{ADD}",  # a full function with imports of its own
        f"```python\n{ADD}```",  # fenced
        "Sure! Here it is:\n\n```py\n    return x + y\n```\nThat adds them.",  # prose around a fence is ignored
        "```python\n    return x + y\n",  # an unclosed fence (generation ran out of tokens)
    ],
)
def test_accepted_submission_forms(factory: HumanEvalFactory, content: str) -> None:
    assert submit(factory, "HumanEval/53", content).reward == 1.0


def test_a_body_with_only_its_first_line_stripped_is_accepted(factory: HumanEvalFactory) -> None:
    body = BY_ID["HumanEval/0"].answer
    assert body.startswith("    for") and submit(factory, "HumanEval/0", body.lstrip()).reward == 1.0


def test_extract_code_and_what_does_not_compile() -> None:
    assert extract_code("text\n```python\nx = 1\n```\nmore\n```\ny = 2\n```") == "x = 1\n"
    assert extract_code("\n\n    return 1\n\n") == "    return 1\n"
    add = problems()["HumanEval/53"]
    assert solution_program(add, "    return x +") is None
    assert solution_program(add, "") is None and solution_program(add, "```python\n```") is None
    assert solution_program(add, VERBOSE_PREFIX + "    return x + y\n") is None
    assert solution_program(add, "    return " + "-" * 200_000 + "1") is None  # too deep to compile: not code
    assert solution_program(add, "    return x + y") == add.prompt + "    return x + y\n"


def test_prose_wrong_channel_and_shaping(factory: HumanEvalFactory) -> None:
    prose = submit(factory, "HumanEval/53", "The answer is x + y.")
    assert (prose.reward, prose.info["syntax_error"], prose.info["format_error"]) == (0.0, 1.0, 0.0)
    [analysis] = play(factory, BY_ID["HumanEval/53"], [[Message("assistant", "    return x + y", channel="analysis")]])
    assert (analysis.reward, analysis.terminated, analysis.info["format_error"]) == (0.0, True, 1.0)
    shaped = HumanEvalFactory(n_train=5, n_test=2, tool_limits=FAST, grader_limits=FAST,
                              weights=RewardWeights(outcome=0.75, format=0.25))  # fmt: skip
    broken = submit(shaped, "HumanEval/53", "    return x - y\n")
    assert (broken.reward, broken.info["reward/format"], broken.info["reward/outcome"]) == (0.25, 0.25, 0.0)
    assert submit(shaped, "HumanEval/53", "    return x + y\n").reward == 1.0


def fake_sandbox(monkeypatch: pytest.MonkeyPatch, behaviour: str, phase: str = "solution.py") -> None:
    """The sandbox fails as ``behaviour`` says in the run whose program compiles ``phase`` (record, serve, check)."""

    async def run(code: str, limits: SandboxLimits, **kwargs: object) -> SandboxResult:
        if f'"{phase}"' not in code:
            return await run_python(code, limits, **kwargs)  # type: ignore[arg-type]
        if behaviour == "unavailable":
            raise SandboxUnavailable("bubblewrap vanished")
        if behaviour == "hang":
            await asyncio.sleep(60)
        return SandboxResult("sandbox_failure", 1, "", "sandbox failed to start (exit 1): no namespaces", 0.1, False)

    monkeypatch.setattr(hg, "run_python", run)
    monkeypatch.setattr(hg, "GRADER_SLACK_S", 0.2)


@pytest.mark.parametrize("phase", ["canonical.py", "solution.py", "test.py"])
@pytest.mark.parametrize("behaviour", ["failure", "unavailable", "hang"])
def test_grader_faults_are_masked_failures_not_zeros(
    factory: HumanEvalFactory, monkeypatch: pytest.MonkeyPatch, behaviour: str, phase: str
) -> None:
    fake_sandbox(monkeypatch, behaviour, phase)  # HumanEval/53 draws random inputs: recorded on every grade
    [result] = play(factory, BY_ID["HumanEval/53"], [final("    return x + y\n")])
    assert isinstance(result.failure, Failure) and result.failure.kind == "sandbox_error"
    assert (result.reward, result.terminated, result.info) == (0.0, False, {})
    # a submission that does not compile never reaches the grader: still the model's 0
    [bad] = play(factory, BY_ID["HumanEval/53"], [final("    return x +")])
    assert (bad.failure, bad.reward, bad.info["syntax_error"]) == (None, 0.0, 1.0)


def test_python_tool_runs_in_the_sandbox(factory: HumanEvalFactory) -> None:
    call = Message("assistant", json.dumps({"code": "print(6 * 7)"}), channel="commentary",
                   recipient="functions.python", content_type="json")  # fmt: skip
    first, second = play(factory, BY_ID["HumanEval/53"], [[call], final("    return x + y\n")])
    assert json.loads(first.observations[0].content) == {"status": "ok", "stdout": "42\n"}
    assert (first.terminated, second.reward, second.info["tool_calls"], second.info["turns"]) == (False, 1.0, 1.0, 2.0)


def test_expert_demo_replays_and_its_tool_result_is_what_the_sandbox_prints(factory: HumanEvalFactory) -> None:
    for i, task in enumerate([TRAIN[0], TRAIN[7], TEST[0]]):
        call, obs, answer = expert_demo(task, random.Random(i), p_tool=1.0)
        real = asyncio.run(run_python(json.loads(call.content)["code"], FAST))
        assert json.loads(obs.content) == {"status": real.status, "stdout": real.stdout}
        assert (real.status, real.stdout, answer.content) == ("ok", "True\n", task.answer)
        first, second = play(factory, task, [[call], [answer]])
        assert first.observations == (obs,)
        assert (second.reward, second.info["correct"], second.info["tool_calls"]) == (1.0, 1.0, 1.0)


def test_expert_imperfections(factory: HumanEvalFactory) -> None:
    task = BY_ID["HumanEval/0"]
    [guess] = expert_demo(task, random.Random(0), p_tool=0.0)
    assert guess.content == broken_solution(problems()["HumanEval/0"]) != task.answer
    assert submit(factory, "HumanEval/0", guess.content).reward == 0.0
    *_, chatty = expert_demo(task, random.Random(0), p_tool=1.0, p_verbose=1.0)
    assert chatty.content == VERBOSE_PREFIX + task.answer
    assert submit(factory, "HumanEval/0", chatty.content).reward == 0.0
    demos = [expert_demo(t, random.Random(i), p_tool=0.5) for i, t in enumerate(TRAIN)]
    assert abs(sum(len(d) == 3 for d in demos) / len(demos) - 0.5) < 0.15
    assert expert_demo(TRAIN[5], random.Random(1)) == expert_demo(TRAIN[5], random.Random(1))


def test_unknown_task_is_a_clear_error(factory: HumanEvalFactory) -> None:
    with pytest.raises(ValueError, match="not a HumanEval task id: 'calc-1'"):
        factory.make(Task("calc-1", "1 + 1", "2", "train"))


def test_config_builds_the_factory(factory: HumanEvalFactory) -> None:
    from harmonyrl.config import ConfigError, load_config
    from harmonyrl.tasks.factory import expert_for, make_factory

    cfg = load_config(None, ["env.name=humaneval", "env.n_train=6", "env.n_test=3", "env.test_timeout_s=3"])
    built = make_factory(cfg.env, seed=0)
    assert isinstance(built, HumanEvalFactory) and (built.grader_limits.timeout_s, built.tool_limits.timeout_s) == (
        3,
        5,
    )
    assert (built.tasks("train"), built.tasks("validation"), built.tasks("test")) == (TRAIN[:6], VAL, TEST[:3])
    expert = expert_for(cfg.env)  # the scripted expert with the env's p_tool / p_verbose bound
    assert isinstance(expert, functools.partial) and expert.func is expert_demo
    assert expert.keywords == {"p_tool": cfg.env.p_tool, "p_verbose": cfg.env.p_verbose}
    with pytest.raises(ConfigError, match=r"'env.n_train': Input should be less than or equal to 104"):
        load_config(None, ["env.name=humaneval", "env.n_train=500"])
