"""The turn structure of every "call tools, then answer on ``final``" environment, written once.

Each turn's last message decides: a call into ``functions.*`` is dispatched and its observation (or the
environment failure) is the step's result; anything else ends the episode, and the environment grades
:func:`final_answer` of it. The environments differ only in how they grade, so they hold a :class:`ToolTurns`
rather than each repeating the dispatch, the counters and the "stepped after the end" check.
"""

from __future__ import annotations

from collections.abc import Sequence

from harmonyrl.envs.tools import Toolbox
from harmonyrl.types import Message, StepResult


def final_answer(action: Sequence[Message]) -> str | None:
    """The content of the turn's last message if it is an assistant message on ``final`` (not a tool call),
    else None: the model did not answer in the graded form."""
    last = action[-1] if action else None
    if last is None or last.role != "assistant" or last.channel != "final" or last.is_tool_call:
        return None
    return last.content


class ToolTurns:
    """One episode's turn counters and its tool turns (see the module docstring)."""

    def __init__(self, toolbox: Toolbox) -> None:
        self.toolbox = toolbox
        self.reset()

    def reset(self) -> None:
        self.turns = 0
        """Turns taken, the answering one included."""
        self.tool_calls = 0
        """Calls into ``functions.*``, well-formed or not."""
        self.tools_ran = 0
        """Calls whose tool ran and returned (outcome ``ok``)."""
        self.results: list[tuple[Message, Message]] = []
        """(call, observation) of every call whose tool ran, in order: what a grader may check an answer against."""
        self.done = False

    async def step(self, action: Sequence[Message]) -> StepResult | None:
        """Count one turn. A tool call returns its :class:`StepResult`: an observation with ``info["tool_error"]``
        (1.0 when the call or the tool failed on the model's arguments), or an environment failure that the loop
        masks (a timeout, an :class:`~harmonyrl.envs.tools.ToolInfraError`). None: the episode is over, grade the
        answer."""
        if self.done:
            raise RuntimeError("step() called after the episode terminated")
        self.turns += 1
        last = action[-1] if action else None
        if last is None or not self.toolbox.handles(last):
            self.done = True
            return None
        self.tool_calls += 1
        dispatch = await self.toolbox.dispatch(last)
        if dispatch.failure is not None:
            return StepResult(failure=dispatch.failure)
        assert dispatch.observation is not None
        self.tools_ran += dispatch.kind == "ok"
        if dispatch.kind == "ok":
            self.results.append((last, dispatch.observation))
        return StepResult(observations=(dispatch.observation,), info={"tool_error": float(dispatch.kind != "ok")})
