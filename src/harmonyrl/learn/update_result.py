"""What one RL step's update did: the typed answer the training loop steers by.

The loop sends new weights to the engine only when the update was ``applied``, and counts consecutive guard
skips for ``rl.guards.stop_after``; both read the typed fields, never a metric. The metrics (which also carry
``train/skipped`` and ``guard/skipped`` for the log) are what the step's row in ``metrics.jsonl`` records.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

SkipReason = Literal["nothing_trainable", "guard"]
"""Why an update changed nothing: no trainable episode was left (every episode failed, or every group was
rewarded alike), or a stability guard tripped and the step was rolled back (which guard: ``guard/trip_*``)."""


@dataclass(frozen=True)
class UpdateResult:
    """The metrics of one RL step's update, and why it was skipped (None: it was applied)."""

    metrics: dict[str, float]
    skip_reason: SkipReason | None = None

    @property
    def applied(self) -> bool:
        """The weights changed: the update ran and no guard rolled it back."""
        return self.skip_reason is None
