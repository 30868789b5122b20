"""RL steps that applied no update because nothing was trainable, said out loud.

With a group-relative advantage (GRPO, RLOO, …) a group whose episodes all scored alike carries no signal and is
dropped; when every group of a step is like that (or every episode was an environment fault) the learner skips
the update (``train/skipped``). One such step is ordinary. Many in a row mean the run is learning nothing — most
often every episode fails because the task is too hard for the warm start — while the console would show only
``reward 0.00``. :class:`SkippedUpdates` counts them, records each step's group make-up
(``rollout/groups``, ``rollout/equal_reward_groups``) and warns, naming the cause, after
:data:`WARN_AFTER` consecutive skips.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from harmonyrl.types import Trajectory

WARN_AFTER = 3
"""Consecutive skipped updates before the warning: one or two happen on a hard batch; three means a stuck run."""


def group_rewards(trajectories: Sequence[Trajectory]) -> dict[int, list[float]]:
    """Rewards of the episodes that did not fail, by group (groups whose every episode failed are absent)."""
    groups: dict[int, list[float]] = {}
    for t in trajectories:
        if t.failure is None:
            groups.setdefault(t.group_id, []).append(t.reward)
    return groups


def skip_cause(trajectories: Sequence[Trajectory]) -> str:
    """Why a step had nothing to train on, in words, e.g. ``all 8 groups had equal rewards (every episode scored
    0): the task may be too hard for the warm start``."""
    groups = group_rewards(trajectories)
    failed = sum(t.failure is not None for t in trajectories)
    if not groups:
        return f"all {len(trajectories)} episodes were environment failures (masked out of the loss; see env/*)"
    faults = f"; {failed} episodes were environment failures" if failed else ""
    equal = sum(len(set(r)) == 1 for r in groups.values())
    head = f"all {equal} groups had equal rewards" if equal == len(groups) else f"{equal} of {len(groups)} groups had"
    head += "" if equal == len(groups) else " equal rewards"
    scores = {r[0] for r in groups.values() if len(set(r)) == 1}
    ok = [t for t in trajectories if t.failure is None]
    if all(not t.success for t in ok):
        why = "the task may be too hard for the warm start (a longer SFT warm start, or an easier task, helps)"
    elif all(t.success for t in ok):
        why = "every episode succeeded: the task may be too easy to learn from"
    else:
        why = "each group's episodes scored alike: more episodes per group (rollout.group_size) give signal"
    scored = f" (every episode scored {min(scores):g})" if len(scores) == 1 else ""
    return f"{head}{scored}{faults}: {why}"


@dataclass
class SkippedUpdates:
    """Consecutive and total RL steps whose update was skipped (``train/skipped``), with one warning per streak,
    given to ``warn`` (a one-line message)."""

    warn: Callable[[str], object]
    warn_after: int = WARN_AFTER
    in_a_row: int = 0
    total: int = 0
    steps: int = 0

    def observe(self, skipped: bool, trajectories: Sequence[Trajectory]) -> dict[str, float]:
        """Count this step (``skipped``: the update found nothing trainable); call ``warn`` with a one-line
        message when the streak reaches ``warn_after``. Returns the step's group metrics, to be logged."""
        groups = group_rewards(trajectories)
        self.steps += 1
        self.in_a_row = self.in_a_row + 1 if skipped else 0
        self.total += skipped
        if skipped and self.in_a_row == self.warn_after:
            self.warn(f"RL: {self.in_a_row} updates in a row skipped, nothing to train on: {skip_cause(trajectories)}")
        return {
            "rollout/groups": float(len({t.group_id for t in trajectories})),
            "rollout/equal_reward_groups": float(sum(len(set(r)) == 1 for r in groups.values())),
        }

    def summary(self) -> str | None:
        """A closing line when any update was skipped (``None`` when every step updated the policy)."""
        if not self.total:
            return None
        return (
            f"RL: {self.total} of {self.steps} updates skipped: nothing trainable in those steps "
            "(equal rewards in every group, or every episode an environment failure; see train/skipped)"
        )
