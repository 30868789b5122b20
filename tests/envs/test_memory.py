"""The memory wrapper: notes and their caps, and any env (calculator, sql) gaining the tools unchanged."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence

import pytest

from harmonyrl.config import load_config
from harmonyrl.envs.checker import assert_env_ok
from harmonyrl.envs.memory import MAX_NOTE_CHARS, MAX_NOTES, MemoryEnv, MemoryFactory, Notes, with_memory
from harmonyrl.tasks.calculator import CalculatorFactory, expression_of
from harmonyrl.tasks.factory import make_factory
from harmonyrl.tasks.sql import SqlFactory, reference_sql
from harmonyrl.types import Message, StepResult, Task


def calc() -> MemoryFactory:
    return with_memory(CalculatorFactory(seed=0, n_train=50, n_test=10))


def sql() -> MemoryFactory:
    return with_memory(SqlFactory(seed=0, n_train=50, n_test=10))


def call(name: str, **args: str) -> list[Message]:
    return [Message("assistant", json.dumps(args), channel="commentary", recipient=f"functions.{name}",
                    content_type="json")]  # fmt: skip


def play(factory: MemoryFactory, task: Task, actions: Sequence[Sequence[Message]]) -> list[StepResult]:
    async def go() -> list[StepResult]:
        env = factory.make(task)
        await env.reset()
        return [await env.step(a) for a in actions]

    return asyncio.run(go())


def body(result: StepResult) -> dict[str, object]:
    assert result.failure is None and not result.terminated and len(result.observations) == 1
    return json.loads(result.observations[0].content)


def test_check_env_passes_wrapped_around_calculator_and_sql() -> None:
    assert_env_ok(calc(), rebuild=calc)
    assert_env_ok(sql(), rebuild=sql)


def test_calculator_episode_with_notes() -> None:
    factory = calc()
    task = factory.tasks("train")[0]
    env = factory.make(task)
    assert [t.name for t in env.tools] == ["calculator", "remember", "recall"]
    assert env.instructions.startswith("Solve the arithmetic problem.") and "remember(key, note)" in env.instructions
    expr = expression_of(task)
    stored, computed, recalled, listed, end = play(factory, task, [
        call("remember", key="expr", note=expr), call("calculator", expression=expr), call("recall", key="expr"),
        call("recall", key=""), [Message("assistant", task.answer, channel="final")],
    ])  # fmt: skip
    assert body(stored) == {"stored": "expr", "notes": 1} and stored.info == {"tool_error": 0.0}
    assert body(computed) == {"result": int(task.answer)}
    assert body(recalled) == {"key": "expr", "note": expr} and body(listed) == {"keys": ["expr"]}
    # the inner env saw only its own calls: one tool call, and the terminal info gains memory_calls
    assert (end.reward, end.terminated, end.info["tool_calls"], end.info["memory_calls"]) == (1.0, True, 1.0, 3.0)


def test_sql_episode_and_a_fresh_store_every_reset() -> None:
    factory = sql()
    task = factory.tasks("test")[0]
    noted, queried, wrong = play(factory, task, [
        call("remember", key="q", note=reference_sql(task)), call("query", sql=reference_sql(task)),
        [Message("assistant", str(int(task.answer) + 1), channel="final")],
    ])  # fmt: skip
    assert body(noted) == {"stored": "q", "notes": 1} and body(queried)["rows"] == [[int(task.answer)]]
    assert (wrong.reward, wrong.info["correct"], wrong.info["memory_calls"]) == (0.0, 0.0, 1.0)
    [missing] = play(factory, task, [call("recall", key="q")])  # a new episode: nothing remembered
    assert body(missing) == {"error": "no note under 'q'; stored keys: []"}


def test_caps_and_bad_calls_are_observations() -> None:
    factory = calc()
    task = factory.tasks("train")[0]
    results = play(factory, task, [call("remember", key=f"k{i}", note="x") for i in range(MAX_NOTES + 1)])
    assert body(results[-1])["error"].startswith(f"already {MAX_NOTES} notes (the limit)")  # type: ignore[union-attr]
    long, nokey, badargs = play(factory, task, [call("remember", key="a", note="x" * (MAX_NOTE_CHARS + 1)),
                                                call("remember", key=" ", note="x"), call("recall")])  # fmt: skip
    assert body(long) == {"error": f"note is {MAX_NOTE_CHARS + 1} characters; the limit is {MAX_NOTE_CHARS}"}
    assert body(nokey) == {"error": "key must be 1 to 40 characters"}
    assert badargs.info == {"tool_error": 1.0} and "key: Field required" in badargs.observations[0].content


def test_notes_replace_and_clash_is_refused() -> None:
    notes = Notes()
    notes.remember("a", "1")
    assert json.loads(notes.remember("a", "2")) == {"stored": "a", "notes": 1}
    assert json.loads(notes.recall("a")) == {"key": "a", "note": "2"}
    inner = calc().make(calc().tasks("train")[0])
    with pytest.raises(ValueError, match=r"already has tool\(s\) \['recall', 'remember'\]"):
        MemoryEnv(inner)


def test_memory_is_a_config_switch() -> None:
    plain = make_factory(load_config(overrides=["env.n_train=10", "env.n_test=2"]).env, seed=0)
    assert isinstance(plain, CalculatorFactory)
    wrapped = make_factory(load_config(overrides=["env.n_train=10", "env.n_test=2", "env.memory=true"]).env, seed=0)
    assert isinstance(wrapped, MemoryFactory) and isinstance(wrapped.inner, CalculatorFactory)
