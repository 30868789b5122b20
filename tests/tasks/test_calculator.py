"""Calculator env: safe evaluation, task splits, exact rewards, the scripted expert."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harmonyrl.envs.tools import Tool, Toolbox, ToolInfraError
from harmonyrl.tasks.arith import calculator, evaluate
from harmonyrl.tasks.calculator import (
    SHAPES,
    TEMPLATES,
    CalculatorEnv,
    CalculatorFactory,
    expert_demo,
    expression_of,
    generate_tasks,
)
from harmonyrl.tasks.guesses import VERBOSE_TEMPLATES
from harmonyrl.types import Message, StepResult, Task

FACTORY = CalculatorFactory(seed=0, n_train=2000, n_test=200)
TASK = Task(id="t", prompt="What is 347 * 28 + 1191?", answer="10907", split="train")


@pytest.mark.parametrize(
    ("expr", "result"),
    [
        ("347 * 28 + 1191", 10907),  # 9716 + 1191
        ("(120 + 345) * 7", 3255),
        ("-3 // 2", -2),
        ("17 % 5", 2),
        ("2 ** 10", 1024),
        ("7 / 2", 3.5),
        ("  -(2 - 5) ", 3),
        ("1_000 + 1", 1001),
    ],
)
def test_calculator_values(expr: str, result: float) -> None:
    assert json.loads(calculator(expr)) == {"result": result}


@pytest.mark.parametrize(
    "expr",
    [
        "__import__('os')",
        "__import__('os').system('true')",
        "x + 1",
        "(lambda: 1)()",
        "9**9**9",
        "2 ** 2 ** 2 ** 2 ** 2",
        "10**60 * 10**60 * 10**60 * 10**60 * 10**60 * 10**60",
        "1 / 0",
        "5 % 0",
        "0 ** -1",
        "2 ** 0.5",
        "1.5 * 2",
        "True + 1",
        "'a' * 3",
        "[1] * 3",
        "1 ^ 2",
        "1 < 2",
        "",
        "1 +",
        "\x00",
        "9" * 10_000,
        "(" * 5000 + ")" * 5000,
        "-" * 199 + "1" + "+" * 10_000,
    ],
)
def test_calculator_hostile_inputs_are_error_text(expr: str) -> None:
    assert set(json.loads(calculator(expr))) == {"error"}


@settings(max_examples=300)
@given(st.one_of(st.text(max_size=80), st.text(alphabet="0123456789+-*/%() ", max_size=60)))
def test_calculator_never_raises(expr: str) -> None:
    assert set(json.loads(calculator(expr))) in ({"result"}, {"error"})


def test_tasks_are_correct_and_varied() -> None:
    train, test = FACTORY.tasks("train"), FACTORY.tasks("test")
    assert (len(train), len(test)) == (2000, 200)
    for task in [*train, *test]:
        assert evaluate(expression_of(task)) == int(task.answer)
    exprs = [expression_of(t) for t in train]
    assert len(set(exprs)) == len(exprs)
    assert len({t.id for t in [*train, *test]}) == 2200
    assert all(t.split == "train" for t in train) and all(t.split == "test" for t in test)
    # every template and every shape shows up (shapes told apart by their operator pattern)
    assert {p.split("{expr}")[0] for p in TEMPLATES} <= {t.prompt.split(expression_of(t))[0] for t in train}
    patterns = {"".join(c for c in e if c in "+-*()") for e in exprs}
    assert len(patterns) == len(SHAPES)


def test_splits_are_disjoint_across_seeds() -> None:
    other = CalculatorFactory(seed=1, n_train=2000, n_test=200)
    train = {expression_of(t) for f in (FACTORY, other) for t in f.tasks("train")}
    test = {expression_of(t) for f in (FACTORY, other) for t in f.tasks("test")}
    assert not train & test
    assert {t.prompt for t in FACTORY.tasks("train")}.isdisjoint(t.prompt for t in FACTORY.tasks("test"))


def test_commuted_test_problems_are_not_in_train() -> None:
    train = {expression_of(t) for t in CalculatorFactory(seed=0, n_train=20_000, n_test=0).tasks("train")}
    for task in FACTORY.tasks("test"):
        expr = expression_of(task)
        if expr.count("*") == 1 and "(" not in expr:  # "a * b ± c": the commuted form is the same problem
            a, rest = expr.split(" * ", 1)
            b, tail = rest.split(" ", 1)
            assert f"{b} * {a} {tail}" not in train


def test_determinism_and_prefix_stability() -> None:
    small = generate_tasks(0, 50, 10)
    assert small == generate_tasks(0, 50, 10)
    assert small != generate_tasks(1, 50, 10)
    assert small[0] == FACTORY.tasks("train")[:50]
    assert small[1] == FACTORY.tasks("test")[:10]


def run_episode(actions: Sequence[Sequence[Message]], env: CalculatorEnv | None = None) -> list[StepResult]:
    async def go() -> list[StepResult]:
        e = env or FACTORY.make(TASK)
        first = await e.reset()
        assert first == [Message(role="user", content=e.task.prompt)]
        results = [await e.step(a) for a in actions]
        await e.close()
        return results

    return asyncio.run(go())


def final(text: str) -> list[Message]:
    return [Message(role="assistant", channel="final", content=text)]


def call(content: str, recipient: str = "functions.calculator") -> list[Message]:
    return [Message(role="assistant", channel="commentary", recipient=recipient, content_type="json", content=content)]


@pytest.mark.parametrize(
    ("text", "reward"),
    [("10907", 1.0), (" 10907\n", 1.0), ("10907.", 1.0), ("10908", 0.0), ("10907.0", 0.0), ("10,907", 0.0),
     ("The answer is 10907", 0.0), ("10907!", 0.0), ("", 0.0)],
)  # fmt: skip
def test_final_answer_rewards(text: str, reward: float) -> None:
    [result] = run_episode([final(text)])
    assert (result.reward, result.terminated, result.truncated, result.failure) == (reward, True, False, None)
    assert result.info == {"correct": reward, "format_error": 0.0, "tool_calls": 0.0}


@pytest.mark.parametrize(
    "action",
    [
        [],
        [Message(role="assistant", channel="analysis", content="10907")],
        [Message(role="assistant", channel="commentary", content="10907")],
        call('{"query": "x"}', recipient="browser.search"),
    ],
)
def test_format_errors_terminate_with_zero(action: list[Message]) -> None:
    [result] = run_episode([action])
    assert (result.reward, result.terminated, result.observations) == (0.0, True, ())
    assert result.info == {"correct": 0.0, "format_error": 1.0, "tool_calls": 0.0}


def test_tool_call_then_final() -> None:
    first, second = run_episode([call('{"expression": "347 * 28 + 1191"}'), final("10907")])
    assert (first.reward, first.terminated, first.failure, first.info) == (
        0.0,
        False,
        None,
        {"tool_error": 0.0},
    )
    assert first.observations == (
        Message(role="tool", content='{"result": 10907}', channel="commentary", recipient="assistant",
                name="functions.calculator"),
    )  # fmt: skip
    assert (second.reward, second.terminated) == (1.0, True)
    assert second.info == {"correct": 1.0, "format_error": 0.0, "tool_calls": 1.0}


@pytest.mark.parametrize(
    ("action", "needle"),
    [
        (call('{"expression": "1 / 0"}'), "division by zero"),
        (call("347 * 28"), "not valid JSON"),
        (call('{"expr": "1"}'), "expression: Field required"),
        (call('{"expression": "1"}', recipient="functions.python"), "unknown tool 'python'"),
    ],
)
def test_model_faults_are_observations(action: list[Message], needle: str) -> None:
    [result] = run_episode([action])
    assert (result.terminated, result.failure, result.reward) == (False, None, 0.0)
    assert needle in json.loads(result.observations[0].content)["error"]


def test_environment_fault_is_a_failure_not_a_score() -> None:
    def calculator(expression: str) -> str:
        """A calculator whose backend is down."""
        raise ToolInfraError("disk on fire")

    env = CalculatorEnv(TASK, Toolbox([Tool.from_function(calculator)]))
    [result] = run_episode([call('{"expression": "1"}')], env)
    assert result.failure is not None and result.failure.kind == "tool_crash"
    assert (result.terminated, result.truncated, result.observations) == (False, False, ())


def test_a_tool_raising_on_the_models_argument_is_read_and_the_episode_graded() -> None:
    def calculator(expression: str) -> str:
        """A calculator that raises on what it cannot parse, as a user's tool will."""
        return str(int(expression))

    env = CalculatorEnv(TASK, Toolbox([Tool.from_function(calculator)]))
    seen, graded = run_episode([call('{"expression": "rect"}'), final("10907")], env)
    assert (seen.failure, seen.terminated, seen.info["tool_error"]) == (None, False, 1.0)
    assert "calculator raised ValueError: invalid literal" in json.loads(seen.observations[0].content)["error"]
    assert (graded.failure, graded.terminated, graded.reward) == (None, True, 1.0)


def test_step_after_termination_raises() -> None:
    with pytest.raises(RuntimeError, match="terminated"):
        run_episode([final("1"), final("2")])


def test_expert_demo_mix_and_correctness() -> None:
    rng = random.Random(0)
    tasks = FACTORY.tasks("train")[:1000]
    demos = [expert_demo(t, rng, p_tool=0.6) for t in tasks]
    with_tool = [(t, d) for t, d in zip(tasks, demos, strict=True) if len(d) == 3]
    assert abs(len(with_tool) / 1000 - 0.6) < 0.05
    for task, (tool_call, obs, answer) in with_tool[:200]:
        assert tool_call.content == json.dumps({"expression": expression_of(task)})
        assert tool_call.recipient == "functions.calculator" and tool_call.content_type == "json"
        assert answer.content == task.answer and answer.channel == "final"
        # replaying the demo through the env reproduces the observation and earns full reward
        env = FACTORY.make(task)
        first, second = run_episode([[tool_call], [answer]], env)
        assert first.observations == (obs,) and second.reward == 1.0
    direct = [(t, d[0]) for t, d in zip(tasks, demos, strict=True) if len(d) == 1]
    wrong = sum(msg.content != t.answer for t, msg in direct)
    assert wrong / len(direct) > 0.9
    # plausible: same sign and within an order of magnitude
    assert all(0.1 < int(m.content) / int(t.answer) < 10 for t, m in direct if int(t.answer) > 100)
    assert all(m.channel == "final" and m.role == "assistant" for _, m in direct)


def test_expert_demo_extremes_and_determinism() -> None:
    tasks = FACTORY.tasks("train")[:50]
    assert all(len(expert_demo(t, random.Random(i), p_tool=1.0)) == 3 for i, t in enumerate(tasks))
    assert all(len(expert_demo(t, random.Random(i), p_tool=0.0)) == 1 for i, t in enumerate(tasks))
    assert expert_demo(TASK, random.Random(3)) == expert_demo(TASK, random.Random(3))


def test_verbose_expert_copies_the_right_number_but_earns_nothing() -> None:
    tasks = FACTORY.tasks("train")[:400]
    demos = [expert_demo(t, random.Random(i), p_tool=1.0, p_verbose=0.5) for i, t in enumerate(tasks)]
    verbose = [(t, d) for t, d in zip(tasks, demos, strict=True) if d[-1].content != t.answer]
    assert abs(len(verbose) / 400 - 0.5) < 0.08
    for task, (tool_call, _, answer) in verbose[:50]:
        assert task.answer in answer.content and answer.content != task.answer
        assert answer.content in {v.format(task.answer) for v in VERBOSE_TEMPLATES}
        _, second = run_episode([[tool_call], [answer]], FACTORY.make(task))
        assert second.reward == 0.0 and second.terminated
