"""The shared turn structure: tool turns are counted and dispatched, anything else ends the episode."""

import asyncio

import pytest

from harmonyrl.envs.tools import Tool, Toolbox, ToolInfraError
from harmonyrl.envs.turns import ToolTurns, final_answer
from harmonyrl.types import Message


def echo(text: str) -> str:
    """Echo the text back.

    Args:
        text: Anything.
    """
    return text


def broken(text: str) -> str:
    """Always fails, and says it is the environment's fault.

    Args:
        text: Anything.
    """
    raise ToolInfraError("backend did not start")


def picky(text: str) -> str:
    """Raises on what the model asked for.

    Args:
        text: Anything.
    """
    return {"hi": "hello"}[text]


def call(name: str, args: str = '{"text": "hi"}') -> Message:
    return Message(role="assistant", channel="commentary", recipient=f"functions.{name}", content=args)


FINAL = Message(role="assistant", channel="final", content="42")


def test_final_answer_only_for_an_assistant_final_message() -> None:
    assert final_answer([call("echo"), FINAL]) == "42"
    assert final_answer([]) is None
    assert final_answer([Message(role="assistant", channel="analysis", content="42")]) is None
    assert final_answer([Message(role="user", content="42")]) is None
    assert final_answer([FINAL, call("echo")]) is None  # the last message decides


def test_tool_turns_count_and_dispatch() -> None:
    turns = ToolTurns(Toolbox([Tool.from_function(echo)]))

    async def play() -> None:
        ok = await turns.step([call("echo")])
        assert ok is not None and ok.observations[0].content == "hi" and ok.info == {"tool_error": 0.0}
        bad = await turns.step([call("echo", "not json")])
        assert bad is not None and bad.failure is None and bad.info == {"tool_error": 1.0}
        unknown = await turns.step([call("nope")])
        assert unknown is not None and unknown.info == {"tool_error": 1.0}
        assert await turns.step([FINAL]) is None
        assert (turns.turns, turns.tool_calls, turns.tools_ran, turns.done) == (4, 3, 1, True)
        # only the call whose tool ran is kept for graders, with its observation
        assert [(c.content, o.content) for c, o in turns.results] == [('{"text": "hi"}', "hi")]
        with pytest.raises(RuntimeError, match="after the episode terminated"):
            await turns.step([FINAL])
        turns.reset()
        assert (turns.turns, turns.tool_calls, turns.tools_ran, turns.done, turns.results) == (0, 0, 0, False, [])

    asyncio.run(play())


def test_a_declared_environment_fault_is_a_failure_not_an_observation() -> None:
    turns = ToolTurns(Toolbox([Tool.from_function(broken)]))
    result = asyncio.run(turns.step([call("broken")]))
    assert result is not None and result.failure is not None and result.failure.kind == "tool_crash"
    assert not result.observations and not turns.done


def test_a_tool_raising_on_the_models_argument_is_an_observation_and_the_turn_goes_on() -> None:
    turns = ToolTurns(Toolbox([Tool.from_function(picky)]))
    result = asyncio.run(turns.step([call("picky", '{"text": "rect"}')]))
    assert result is not None and result.failure is None and result.info == {"tool_error": 1.0}
    assert [o.content for o in result.observations] == ['{"error": "picky raised KeyError: \'rect\'"}']
    assert (turns.done, turns.tools_ran, turns.results) == (False, 0, [])
