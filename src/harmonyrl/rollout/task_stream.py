"""Which training tasks an RL step runs: the task stream, and the protocol a curriculum shares with it.

The default stream walks the training split in order, ``rollout.tasks_per_step`` tasks per step, wrapping around:
step ``s`` runs tasks ``s * tasks_per_step ...``. Dynamic sampling (:mod:`harmonyrl.rollout.sampling`) may take
more tasks in a step, so the stream keeps its position (``cursor``) and a checkpoint saves it: a resumed run
draws exactly the tasks an uninterrupted one would. A curriculum (:mod:`harmonyrl.rollout.curriculum`) is another
:class:`TaskSource` with the same three methods.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from harmonyrl.types import Task, Trajectory

SourceState = dict[str, object]
"""A task source's position as plain containers (what a checkpoint may hold)."""


class TaskSource(Protocol):
    """Draws the tasks of an RL step and learns from their episodes (a curriculum does; the stream does not)."""

    def draw(self, step: int, n: int) -> list[Task]:
        """The next ``n`` tasks for RL step ``step`` (0-based), advancing the source."""
        ...

    def observe(self, trajectories: Sequence[Trajectory]) -> dict[str, float]:
        """Take in a step's episodes; returns the source's metrics for that step."""
        ...

    def state(self) -> SourceState:
        """The position to save with a checkpoint (plain containers)."""
        ...


class SequentialTasks:
    """The training split in order, wrapping around: the stream every run used before dynamic sampling."""

    def __init__(self, tasks: Sequence[Task], cursor: int = 0) -> None:
        if not tasks:
            raise ValueError("the training split is empty")
        self._tasks = tasks
        self.cursor = cursor

    def draw(self, step: int, n: int) -> list[Task]:
        """``n`` tasks from the cursor on (``step`` is not needed: the cursor is the position)."""
        start = self.cursor
        self.cursor += n
        return [self._tasks[(start + i) % len(self._tasks)] for i in range(n)]

    def observe(self, trajectories: Sequence[Trajectory]) -> dict[str, float]:
        """The stream does not adapt: no metrics."""
        return {}

    def state(self) -> SourceState:
        """``{"kind": "sequential", "cursor": …}``."""
        return {"kind": "sequential", "cursor": self.cursor}
