"""A FIFO replay buffer of finished trajectories for the off-policy (soft Q) learner.

Soft Q-learning fits ``Q`` to Bellman targets, which are valid for any behaviour policy, so old episodes can
be trained on again; the buffer trades freshness for sample efficiency. Design choices:

* Whole trajectories, not tokens: targets bootstrap along an episode (:mod:`harmonyrl.algorithms.soft_q`),
  so an episode is trained as a unit and collated like on-policy data.
* Environment faults (``failure`` set) never enter: they are not the model's doing and never train.
* FIFO eviction: with a bounded buffer the oldest episodes are the most off-policy ones.
* Determinism: sampling uses a private ``random.Random(seed)``, so a run is reproducible and a resume that
  restores :meth:`ReplayBuffer.state_dict` draws exactly the batches the uninterrupted run would have drawn.
* Plain-data state: :meth:`ReplayBuffer.state_dict` holds the trajectories as the one plain-data record of
  :mod:`harmonyrl.trajectory_codec` (every field; routing as its tensor), never as pickled classes, so a
  checkpoint holding it loads with
  ``torch.load(weights_only=True)`` and a crafted run folder cannot run code (see :mod:`.checkpoint`).
  Python floats round-trip bit for bit through it.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

from harmonyrl.trajectory_codec import trajectory_from_plain, trajectory_to_plain
from harmonyrl.types import Trajectory


class ReplayBuffer:
    """Holds at most ``capacity`` trajectories; the oldest is evicted first."""

    def __init__(self, capacity: int, seed: int) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"replay capacity must be an integer ≥ 1, got {capacity!r}")
        self.capacity = capacity
        self.seed = seed
        self._items: deque[Trajectory] = deque(maxlen=capacity)
        self._rng = random.Random(seed)
        self.num_skipped = 0
        """Trajectories refused so far because of an environment failure (a metric for the trainer)."""

    def __len__(self) -> int:
        return len(self._items)

    def add(self, trajectories: Iterable[Trajectory]) -> int:
        """Append trajectories in order, evicting the oldest beyond capacity; returns how many were kept.

        Trajectories with ``failure`` set are skipped and counted in :attr:`num_skipped`.
        """
        kept = 0
        for traj in trajectories:
            if traj.failure is not None:
                self.num_skipped += 1
                continue
            self._items.append(traj)
            kept += 1
        return kept

    def sample(self, n: int) -> list[Trajectory]:
        """Draw ``n`` trajectories: without replacement when ``n ≤ len(self)``, with replacement otherwise.

        Deterministic given the seed and the history of ``add``/``sample`` calls. Raises ``ValueError`` for
        ``n < 1`` or an empty buffer.
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"sample size must be an integer ≥ 1, got {n!r}")
        if not self._items:
            raise ValueError("cannot sample from an empty replay buffer (add trajectories first)")
        items = list(self._items)
        if n <= len(items):
            return self._rng.sample(items, n)
        return self._rng.choices(items, k=n)

    def state_dict(self) -> dict[str, Any]:
        """Everything a resume needs, as plain data: contents (oldest first), RNG state, counters."""
        return {
            "capacity": self.capacity,
            "seed": self.seed,
            "rng_state": self._rng.getstate(),
            "items": [trajectory_to_plain(t) for t in self._items],
            "num_skipped": self.num_skipped,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore contents and RNG state. A smaller capacity than the saved one keeps the newest items."""
        missing = {"rng_state", "items"} - set(state)
        if missing:
            raise ValueError(f"replay state is missing {sorted(missing)}")
        try:
            items = [trajectory_from_plain(d) for d in state["items"]]
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"replay state 'items' must hold plain Trajectory records: {e!r}"[:300]) from e
        self._items = deque(items, maxlen=self.capacity)
        self._rng.setstate(state["rng_state"])
        self.num_skipped = int(state.get("num_skipped", 0))
