"""An episode's harmony messages as a verifiers ``Trace``, built turn by turn the way verifiers' interception
server builds one from a harness's requests, so the task's ``@vf.reward`` / ``@vf.metric`` functions, its
``@vf.stop`` predicates and its judges read the trace they were written against.

Mapping of one assistant turn (the messages the model produced before yielding) to one verifiers
``AssistantMessage``: ``analysis`` text becomes ``reasoning_content``, ``final`` text ``content``, each call into
``functions.NAME`` a ``ToolCall`` (``NAME``, its JSON arguments as sampled; ids ``call_<turn>_<i>``, as the
chat completions wire has them). A tool's observation becomes a ``ToolMessage`` answering its call. No token ids
are attached: harmonyrl's own rollout keeps those (a verifiers ``TurnTokens`` would be a second, unused copy).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from harmonyrl.types import Message


def _vf() -> Any:
    import verifiers.v1 as vf

    return vf


class TraceRecorder:
    """The verifiers trace of one episode of ``task`` (a verifiers ``Task``), with ``tools`` (verifiers ``Tool``
    declarations) offered on every turn."""

    def __init__(self, task: Any, tools: Sequence[Any], opening: Sequence[Any]) -> None:
        vf = _vf()
        from verifiers.v1.harnesses.null import NullHarnessConfig
        from verifiers.v1.runtimes import SubprocessConfig
        from verifiers.v1.state import state_cls

        agent = vf.AgentConfig(harness=NullHarnessConfig(id="null"), runtime=SubprocessConfig(), model="harmonyrl")
        self.trace = vf.Trace(
            task=vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
            state=state_cls(type(task))(),
            agent=vf.AgentInfo(config=agent),
        )
        self.tools = list(tools)
        self.history: list[Any] = list(opening)
        """The conversation so far, as the chat program would send it on the next request."""
        self.pending_calls: list[Any] = []
        """The last turn's tool calls not yet answered."""
        self.turns = 0

    def assistant(self, action: Sequence[Message], truncated: bool = False) -> Any:
        """Commit one assistant turn (as the ``Response`` to the conversation so far); returns the ``Response``."""
        vf = _vf()
        from verifiers.v1.graph import prepare_turn

        reasoning = [m.content for m in action if m.role == "assistant" and m.channel == "analysis"]
        final = [m.content for m in action if m.role == "assistant" and not m.is_tool_call and m.channel != "analysis"]
        calls = [
            vf.ToolCall(id=f"call_{self.turns}_{i}", name=m.tool_name or "", arguments=m.content)
            for i, m in enumerate(m for m in action if m.is_tool_call)
        ]
        message = vf.AssistantMessage(
            content="\n".join(final) if final else None,
            reasoning_content="\n".join(reasoning) if reasoning else None,
            tool_calls=calls or None,
        )
        reason = "length" if truncated else "tool_calls" if calls else "stop"
        response = vf.Response(
            id=f"harmonyrl-{self.trace.id}-{self.turns}",
            created=int(time.time()),
            model="harmonyrl",
            message=message,
            finish_reason=reason,
        )
        prepare_turn(self.trace, self.history, self.tools).commit(response)
        self.history.append(message)
        self.pending_calls = list(calls)
        self.turns += 1
        return response

    def tool_result(self, call_index: int, name: str, content: str) -> None:
        """The answer to the last turn's ``call_index``-th call."""
        vf = _vf()
        call = self.pending_calls[call_index]
        self.history.append(vf.ToolMessage(tool_call_id=call.id, content=content, name=name))

    def close(self) -> None:
        """Record trailing messages no turn answered (a tool result after the last turn), as the interception
        server does for an input that ended before inference."""
        from verifiers.v1.graph import prepare_turn

        prepare_turn(self.trace, self.history, self.tools).commit_prompt()
        self.trace.is_completed = True
        self.trace.ok = not self.trace.errors
