"""The team contract: an episode played by several agents with roles, one after another (a relay).

A team factory is an :class:`~harmonyrl.envs.base.EnvFactory` (its ``make`` is the first role's env, the one that
sees the task, so prompt-fit checks and readers of ``make`` see what the first role sees) that also names its
``roles`` and gives one ordinary factory per role:

    team.roles                     # ("planner", "executor")
    team.role_factory(0).make(task)                              # the first role sees the task itself
    team.role_factory(1).make(replace(task, prompt=handoff))     # later roles see only the previous role's message

Each role is an ordinary env speaking harmony, with its own instructions and tools, so each role's episode is an
ordinary trajectory with its own loss mask. The harness (:mod:`harmonyrl.rollout.team`) runs the roles in order,
hands each role's final-channel message to the next as the ``prompt`` of the task it is given, and gives every
role the last role's reward (the team's). ``role_expert(i)`` is role ``i``'s scripted expert for the SFT warm
start, called with the task as that role sees it.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from harmonyrl.envs.base import Env, EnvFactory
from harmonyrl.types import Message, Split, Task

RoleExpert = Callable[[Task, random.Random], list[Message]]
"""A role's scripted expert: the assistant side (plus tool results) of a demonstration of the task as the role
sees it (for a later role: the task whose ``prompt`` is the previous role's message)."""


@runtime_checkable
class TeamFactory(Protocol):
    """An env factory whose episodes are played by ``roles`` in order (see the module docstring)."""

    name: str
    roles: tuple[str, ...]

    def tasks(self, split: Split) -> Sequence[Task]: ...

    def make(self, task: Task) -> Env: ...

    def role_factory(self, role: int) -> EnvFactory: ...

    def role_expert(self, role: int) -> RoleExpert: ...
