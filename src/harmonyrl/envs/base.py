"""The environment contract.

An environment is created per episode from a task; it is async so that tools can run off the event
loop while other episodes keep generating. It is a Protocol: users do not subclass anything.

    env = factory.make(task)
    first = await env.reset()                 # the user message(s); the harmony layer adds system and
                                              # developer messages from env.instructions and env.tools
    result = await env.step(assistant_msgs)   # the parsed messages of one assistant turn
    ...until result.terminated or result.truncated

``step`` receives the messages the model produced in one turn; the last one decides what happens:
a tool call (``recipient="functions.NAME"``) runs the tool and returns its result as an observation;
a ``final`` message is graded.

Who is to blame (invariant 5: terminated ≠ truncated ≠ failed) is decided by one rule:

* **the model's doing is an observation.** Malformed or unknown tool calls, arguments that fail the schema and
  any exception a tool raises while handling the model's arguments come back as an error observation the model
  reads; the turn goes on and the episode is graded as usual. (A tool that raises on a bad argument does not
  have to catch it: :class:`~harmonyrl.envs.tools.Toolbox` turns it into ``{"error": "convert raised KeyError:
  'rect'"}``.)
* **only what says nothing about the model is an environment fault**, returned as ``StepResult.failure`` and
  masked out of the loss, never scored as a wrong answer: a tool call outliving its timeout, the sandbox or a
  worker process dying, an injected fault (:mod:`harmonyrl.envs.faults`), ``make``/``reset``/``step``/``close``
  themselves raising (the scheduler records ``env_error``), and a tool raising
  :class:`~harmonyrl.envs.tools.ToolInfraError` to declare an infrastructure failure.

An env that does its own dispatch must keep the same line; ``check-env`` calls every tool with wrong arguments
and reports where each exception lands.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from harmonyrl.types import Message, Split, StepResult, Task, ToolSpec


class Env(Protocol):
    @property
    def tools(self) -> Sequence[ToolSpec]: ...

    @property
    def instructions(self) -> str:
        """Developer instructions (plain text); rendered with the tool declarations by the harmony layer."""
        ...

    async def reset(self) -> list[Message]: ...

    async def step(self, action: Sequence[Message]) -> StepResult: ...

    async def close(self) -> None: ...


class EnvFactory(Protocol):
    """Holds the task splits and makes one Env per episode.

    Three splits, disjoint by the env's canonical key (what a problem is, not how it is worded): ``train`` is what
    RL and the warm start draw from; ``validation`` is where settings are chosen (``harmonyrl sweep``, presets,
    ``harmonyrl eval --split validation``); ``test`` is where the chosen settings are measured, once. Each built-in
    env says in its module docstring where its validation tasks come from (docs/envs.md); a user's factory without
    a validation split gets one carved from its train split (:mod:`harmonyrl.tasks.custom`)."""

    name: str

    def tasks(self, split: Split) -> Sequence[Task]: ...

    def make(self, task: Task) -> Env: ...
