"""The exact-answer graders (calculator, retool, sql, browse) under attack: answer-format tricks and tool tricks.

Every one of these graders compares the ``final`` message with the task's answer after stripping surrounding
whitespace and one trailing period (:func:`harmonyrl.envs.reward.exact_match`, and the calculator's own
``is_correct``); tool results are observations, never graded. The expectations below are derived from that
rule by hand; the same battery passed unchanged at main (these graders had no hole to close). The sql grader also
requires the answer to come from a query that read the database (tests/tasks/test_sql.py), so its episodes here
run the task's reference query first (:func:`lead`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence

import pytest

from harmonyrl.sandbox import SandboxUnavailable
from harmonyrl.tasks.browse import BrowseFactory, answer_page
from harmonyrl.tasks.calculator import CalculatorFactory
from harmonyrl.tasks.retool import RetoolFactory
from harmonyrl.tasks.sql import SqlFactory, reference_sql
from harmonyrl.types import Message, StepResult, Task

FULLWIDTH = str.maketrans("0123456789", "０１２３４５６７８９")
ARABIC_INDIC = str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩")


def retool() -> RetoolFactory:
    try:
        return RetoolFactory(seed=0, n_train=3, n_test=1)
    except SandboxUnavailable as e:
        pytest.skip(f"bubblewrap cannot sandbox on this machine: {e}")


FACTORIES: dict[str, Callable[[], object]] = {
    "calculator": lambda: CalculatorFactory(seed=0, n_train=3, n_test=1),
    "retool": retool,
    "sql": lambda: SqlFactory(seed=0, n_train=3, n_test=1),
    "browse": lambda: BrowseFactory(seed=0, n_train=3, n_test=1),
}
ANSWERS = {"calculator": "4515", "retool": "49", "sql": "44", "browse": "1539"}  # each factory's first train task
INJECT = {  # a tool call whose observation shows the right answer
    "calculator": ("calculator", {"expression": "{a}"}),
    "retool": ("python", {"code": "print({a})"}),
    "sql": ("query", {"sql": "SELECT {a}"}),
    "browse": ("search", {"query": "{a}"}),
}


def final(text: str, channel: str = "final") -> Message:
    return Message("assistant", text, channel=channel)


def call(env: str, answer: str) -> Message:
    tool, args = INJECT[env]
    content = json.dumps({k: v.format(a=answer) for k, v in args.items()})
    return Message("assistant", content, channel="commentary", recipient=f"functions.{tool}", content_type="json")


def lead(env: str, task: Task) -> list[list[Message]]:
    """The turns before the answer: sql's reference query and browse's answer page (their answers must come from a
    query or a page read), else none."""
    if env == "sql":
        content, tool = json.dumps({"sql": reference_sql(task)}), "query"
    elif env == "browse":
        content, tool = json.dumps({"page_id": answer_page(task)}), "open"
    else:
        return []
    return [[Message("assistant", content, channel="commentary", recipient=f"functions.{tool}", content_type="json")]]


def play(env_name: str, turns: Sequence[Sequence[Message]]) -> tuple[Task, list[StepResult]]:
    factory = FACTORIES[env_name]()
    task = factory.tasks("train")[0]  # type: ignore[attr-defined]
    assert task.answer == ANSWERS[env_name]

    async def go() -> list[StepResult]:
        env = factory.make(task)  # type: ignore[attr-defined]
        await env.reset()
        return [await env.step(t) for t in [*lead(env_name, task), *turns]][len(lead(env_name, task)) :]

    return task, asyncio.run(go())


def numeric_attacks(a: str) -> dict[str, tuple[str, float]]:
    """(content, expected reward) for an integer answer ``a``; only the first three are the answer."""
    return {
        "bare": (a, 1.0),
        "whitespace": (f" \n\t{a} \n", 1.0),  # surrounding whitespace is tolerated (documented)
        "period": (f"{a}.", 1.0),  # and one trailing period
        "two_periods": (f"{a}..", 0.0),
        "twice": (f"{a} {a}", 0.0),
        "two_lines": (f"{a}\n{a}", 0.0),
        "two_candidates": (f"{int(a) - 1}, {a}", 0.0),
        "sentence": (f"The answer is {a}.", 0.0),
        "fullwidth": (a.translate(FULLWIDTH), 0.0),
        "arabic_indic": (a.translate(ARABIC_INDIC), 0.0),
        "leading_zero": (f"0{a}", 0.0),
        "plus": (f"+{a}", 0.0),
        "decimal": (f"{a}.0", 0.0),
        "every_candidate": (" ".join(str(i) for i in range(10_000)), 0.0),
        "json_object": (json.dumps({"answer": int(a)}), 0.0),
        "json_string": (json.dumps(a), 0.0),
        "json_list": (f"[{a}]", 0.0),
        "markdown": (f"**{a}**", 0.0),
        "code": (f"`{a}`", 0.0),
        "empty": ("", 0.0),
    }


CASES = [(env, name, *case) for env, a in ANSWERS.items() for name, case in numeric_attacks(a).items()]


@pytest.mark.parametrize(("env", "name", "content", "reward"), CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_answer_format_tricks(env: str, name: str, content: str, reward: float) -> None:
    _, [result] = play(env, [[final(content)]])
    assert (result.failure, result.terminated, result.reward, result.info["correct"]) == (None, True, reward, reward)


def test_a_name_answer_is_matched_exactly() -> None:
    factory = BrowseFactory(seed=0, n_train=3, n_test=1)
    task = factory.tasks("train")[1]
    assert task.answer == "Gilford"
    expected = {"Gilford": 1.0, "Gilford.": 1.0, " Gilford\n": 1.0, "gilford": 0.0, "GILFORD": 0.0,
                '"Gilford"': 0.0, "Gilford or Penstead": 0.0, "Penstead Gilford": 0.0,
                "Gilford, probably": 0.0}  # fmt: skip

    async def grade(content: str) -> float:
        env = factory.make(task)
        await env.reset()
        [read] = lead("browse", task)
        assert not (await env.step(read)).terminated
        return (await env.step([final(content)])).reward

    assert {c: asyncio.run(grade(c)) for c in expected} == expected


@pytest.mark.parametrize("env", sorted(ANSWERS))
def test_tool_output_is_never_graded(env: str) -> None:
    a = ANSWERS[env]
    # the tool shows the answer, then the model answers with something else: only the final message counts
    _, [seen, result] = play(env, [[call(env, a)], [final("see the tool result above")]])
    assert seen.failure is None and not seen.terminated and a in seen.observations[0].content
    assert (result.terminated, result.reward, result.info["correct"]) == (True, 0.0, 0.0)
    # the answer on the analysis channel is not an answer
    _, [thinking] = play(env, [[final(a, channel="analysis")]])
    assert (thinking.reward, thinking.info["format_error"]) == (0.0, 1.0)


@pytest.mark.parametrize("env", sorted(ANSWERS))
def test_only_the_turns_last_message_is_the_answer(env: str) -> None:
    a = ANSWERS[env]
    # a right final followed by a tool call in the same turn: the call runs, the episode goes on
    _, [first, second] = play(env, [[final(a), call(env, a)], [final("0")]])
    assert (first.terminated, first.reward, second.terminated, second.reward) == (False, 0.0, True, 0.0)
    # a tool call followed by a right final: the final is graded and the call never runs
    _, [only] = play(env, [[call(env, "1"), final(a)]])
    leading_calls = float(env in ("sql", "browse"))  # sql's reference query and browse's page ran before (lead)
    assert (only.terminated, only.reward, only.info["tool_calls"]) == (True, 1.0, leading_calls)


@pytest.mark.parametrize("env", sorted(ANSWERS))
def test_calling_a_tool_after_the_answer_is_a_harness_error(env: str) -> None:
    factory = FACTORIES[env]()

    async def go() -> None:
        task = factory.tasks("train")[0]  # type: ignore[attr-defined]
        game = factory.make(task)
        await game.reset()
        for turn in lead(env, task):
            await game.step(turn)
        assert (await game.step([final(ANSWERS[env])])).reward == 1.0
        with pytest.raises(RuntimeError, match="after the episode"):
            await game.step([call(env, ANSWERS[env])])

    asyncio.run(go())
