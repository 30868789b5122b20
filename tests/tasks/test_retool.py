"""Retool: word problems and their splits, the expert replayed through the real sandbox, failure semantics."""

from __future__ import annotations

import asyncio
import json
import random
import re
import string
from collections.abc import Sequence

import pytest

from harmonyrl.envs.checker import assert_env_ok
from harmonyrl.envs.python_tool import make_python_tool
from harmonyrl.envs.reward import AnswerEnv, RewardWeights
from harmonyrl.envs.tools import Toolbox
from harmonyrl.sandbox import SandboxLimits, SandboxUnavailable
from harmonyrl.tasks.arith import evaluate
from harmonyrl.tasks.guesses import VERBOSE_TEMPLATES
from harmonyrl.tasks.retool import (
    INSTRUCTIONS,
    SHAPES,
    RetoolFactory,
    expert_demo,
    generate_tasks,
    program_of,
)
from harmonyrl.types import Message, StepResult, Task

LIMITS = SandboxLimits(timeout_s=1, cpu_s=1, memory_mib=256, max_processes=16, max_output_bytes=4096)
MISSING = "/nonexistent/harmonyrl-test/bwrap"


def small() -> RetoolFactory:
    return RetoolFactory(seed=0, n_train=60, n_test=10, limits=LIMITS)


@pytest.fixture(scope="module")
def factory() -> RetoolFactory:
    """Only the tests that run code need bubblewrap; elsewhere they skip with the measured cause."""
    try:
        return small()
    except SandboxUnavailable as e:
        pytest.skip(f"bubblewrap cannot sandbox on this machine: {e}")


TRAIN, TEST = generate_tasks(0, 2000, 100)


def test_check_env_passes(factory: RetoolFactory) -> None:
    assert_env_ok(factory, rebuild=small)


def template_of(task: Task) -> tuple[str, str]:
    """(shape name, template) whose wording the prompt has."""
    for shape in SHAPES:
        for template in shape.templates:
            parts = [re.escape(lit) + (".+?" if f else "") for lit, f, _, _ in string.Formatter().parse(template)]
            if re.fullmatch("".join(parts), task.prompt):
                return shape.name, template
    raise AssertionError(task.prompt)


def test_tasks_are_correct_and_varied() -> None:
    for task in (*TRAIN, *TEST):
        program = program_of(task)
        assert program.startswith("print(") and str(evaluate(program[6:-1])) == task.answer
        assert int(task.answer) >= 0
    assert len({t.prompt for t in TRAIN}) == 2000 and len({t.id for t in (*TRAIN, *TEST)}) == 2100
    assert {template_of(t)[1] for t in TRAIN} == {tpl for shape in SHAPES for tpl in shape.templates}


def key(task: Task) -> tuple[str, tuple[int, ...], str]:
    """Shape, multiset of numbers and answer: equal only for the same problem up to reordering and rewording."""
    return template_of(task)[0], tuple(sorted(int(x) for x in re.findall(r"\d+", task.prompt))), task.answer


def test_splits_disjoint_across_seeds_and_rewordings() -> None:
    other_train, other_test = generate_tasks(1, 2000, 100)
    # the key is the shape and its numbers: the same numbers never sit on both sides, however worded
    train = {key(t) for t in (*TRAIN, *other_train)}
    test = {key(t) for t in (*TEST, *other_test)}
    assert not train & test
    assert all(t.split == "train" for t in TRAIN) and all(t.split == "test" for t in TEST)


def test_determinism_and_prefix_stability(factory: RetoolFactory) -> None:
    assert generate_tasks(0, 50, 10) == (TRAIN[:50], TEST[:10])
    assert generate_tasks(1, 50, 10) != (TRAIN[:50], TEST[:10])
    assert tuple(factory.tasks("train")) == TRAIN[:60] and tuple(factory.tasks("test")) == TEST[:10]


def play(env: AnswerEnv, actions: Sequence[Sequence[Message]]) -> list[StepResult]:
    async def go() -> list[StepResult]:
        assert await env.reset() == [Message("user", env.task.prompt)]
        results = [await env.step(a) for a in actions]
        await env.close()
        return results

    return asyncio.run(go())


def final(text: str) -> list[Message]:
    return [Message("assistant", text, channel="final")]


def code(program: str) -> list[Message]:
    args = json.dumps({"code": program})
    return [Message("assistant", args, channel="commentary", recipient="functions.python", content_type="json")]


def test_expert_demo_replays_through_the_real_sandbox(factory: RetoolFactory) -> None:
    tasks = list({template_of(t)[0]: t for t in TRAIN[:100]}.values())[:4]  # four shapes, four sandbox runs
    for task in tasks:
        call, obs, answer = expert_demo(task, random.Random(0), p_tool=1.0)
        first, second = play(factory.make(task), [[call], [answer]])
        assert first.failure is None and first.observations == (obs,)  # the demo's observation is the real one
        assert (second.reward, second.terminated, second.info["correct"]) == (1.0, True, 1.0)
        assert second.info["tool_calls"] == 1.0 and second.info["reward/outcome"] == 1.0


def test_wrong_and_verbose_answers_earn_nothing(factory: RetoolFactory) -> None:
    task = TRAIN[0]
    assert play(factory.make(task), [final(str(int(task.answer) + 1))])[0].reward == 0.0
    *_, verbose = expert_demo(task, random.Random(0), p_tool=1.0, p_verbose=1.0)
    assert verbose.content in {v.format(task.answer) for v in VERBOSE_TEMPLATES}
    [result] = play(factory.make(task), [[verbose]])
    assert (result.reward, result.terminated, result.info["correct"], result.info["format_error"]) == (0, 1, 0, 0)


def test_code_errors_are_observations_and_the_episode_goes_on(factory: RetoolFactory) -> None:
    task = TRAIN[0]
    crashed, looped, answered = play(factory.make(task), [code("1/0"), code("while True: pass"), final(task.answer)])
    for result, status in ((crashed, "error"), (looped, "timeout")):
        assert result.failure is None and not result.terminated and result.reward == 0.0
        assert json.loads(result.observations[0].content)["status"] == status
    assert "ZeroDivisionError" in json.loads(crashed.observations[0].content)["stderr"]
    assert answered.reward == 1.0 and answered.info["tool_calls"] == 2.0


def test_invalid_arguments_are_observations(factory: RetoolFactory) -> None:
    [result] = play(
        factory.make(TRAIN[0]), [[Message("assistant", '{"program": "1"}', "commentary", "functions.python")]]
    )
    assert result.failure is None and "code: Field required" in json.loads(result.observations[0].content)["error"]


@pytest.mark.filterwarnings("ignore::harmonyrl.sandbox.UnsafeExecutionWarning")
def test_a_sandbox_that_cannot_start_is_a_failure_not_a_score() -> None:
    # unsafe fallback with an interpreter that does not exist: the sandbox never starts (env's fault)
    broken = make_python_tool(LIMITS, allow_unsafe=True, bwrap=MISSING, python="/nonexistent/python3")
    env = AnswerEnv(TRAIN[0], Toolbox([broken]), INSTRUCTIONS, RewardWeights())
    [result] = play(env, [code("print(1)")])
    assert result.failure is not None and result.failure.kind == "sandbox_error"
    assert (result.reward, result.terminated, result.truncated, result.observations) == (0.0, False, False, ())


def test_factory_refuses_without_bubblewrap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")  # no bwrap: fail at set-up, naming the fix, not per episode
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
        RetoolFactory(n_train=5, n_test=1)


def test_expert_mix_extremes_and_determinism() -> None:
    demos = [expert_demo(t, random.Random(i), p_tool=0.6) for i, t in enumerate(TRAIN[:1000])]
    assert abs(sum(len(d) == 3 for d in demos) / 1000 - 0.6) < 0.05
    guesses = [(t, d[0].content) for t, d in zip(TRAIN, demos, strict=False) if len(d) == 1]
    assert sum(g != t.answer for t, g in guesses) / len(guesses) > 0.9
    assert all(len(expert_demo(t, random.Random(i), p_tool=0.0)) == 1 for i, t in enumerate(TRAIN[:50]))
    assert expert_demo(TRAIN[3], random.Random(7)) == expert_demo(TRAIN[3], random.Random(7))
    call = expert_demo(TRAIN[3], random.Random(0), p_tool=1.0)[0]
    assert call.recipient == "functions.python" and json.loads(call.content) == {"code": program_of(TRAIN[3])}
    with pytest.raises(ValueError, match="not a generated retool problem"):
        program_of(Task("x", "What is 2 + 2?", "4", "train"))
