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

A **seated** team (:class:`SeatedTeam`: the seats of a game) plays its roles at the same time, turn by turn, not
one after another: ``table(task)`` sets one shared game and gives one factory per seat, and the harness
(:mod:`harmonyrl.rollout.seats`) runs those seats' episodes concurrently, each seat keeping its own reward. A
single-agent factory whose episodes each play one of several seats (against a fixed opponent) can name them too
(:class:`SeatTagged`), for per-seat metrics.
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


@runtime_checkable
class SeatedTeam(TeamFactory, Protocol):
    """A team whose roles play one shared episode at the same time, turn by turn (see the module docstring).

    ``role_factory(i).make(task)`` is seat ``i`` alone (against a scripted opponent: what the SFT warm start and
    ``check-env`` read); ``table(task)`` is one fresh shared game, one factory per seat, each ``make`` called once.
    ``role_terms`` are reward terms averaged per seat into the metrics (e.g. ``win``, ``draw``, ``loss``)."""

    role_terms: tuple[str, ...]

    def table(self, task: Task) -> Sequence[EnvFactory]: ...


@runtime_checkable
class SeatTagged(Protocol):
    """A single-agent factory whose episodes each play one of ``roles`` (a seat against a fixed opponent), the
    seat decided by the task (``role_of(task_id)``): the per-seat metrics of a team, for a game against a fixed
    opponent. ``role_terms`` as for :class:`SeatedTeam`."""

    name: str
    roles: tuple[str, ...]
    role_terms: tuple[str, ...]

    def role_of(self, task_id: str) -> int | None: ...
