"""The circuit breaker: a run whose episodes keep faulting stops with a one-line reason (invariant 8).

Environment faults are masked so a flaky tool costs a few episodes, not the run. But masking has no end: a
broken environment (a database gone, a sandbox that no longer starts) would make every step train on nothing
and the run "succeed" with its steps skipped. The breaker watches the fraction of each RL step's episodes that
still fault after group retries: when it is above ``rollout.fault_breaker.max_fraction`` for
``consecutive_steps`` steps in a row, the run stops with :class:`FaultBreakerTripped`, naming the dominant
failure class over those steps and one example of it.

Default (more than 50 % for 3 steps): with ``env_faults.rate`` = r of tool calls failing, an episode with c tool
calls faults with probability 1 - (1 - r)^c, 0.49 for the README demo's r = 0.2 even at c = 3, and a step of
many episodes sits near that mean; a broken environment faults every episode and stops the run after 3 steps.

Its state (the faulted steps of the current streak) is plain data saved with the resume checkpoint, so a
resumed run stops at the same step as an uninterrupted one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from harmonyrl.config import FaultBreakerConfig
from harmonyrl.types import Trajectory

EXAMPLE_CHARS = 160
"""How much of one failure's detail the stop message quotes."""


class FaultBreakerTripped(RuntimeError):
    """The run stopped because too many episodes faulted for too long; the message is one line."""


@dataclass
class _FaultedStep:
    fraction: float
    kinds: dict[str, int]
    example: dict[str, str]
    """One failure detail per kind, the first seen."""


@dataclass
class FaultBreaker:
    cfg: FaultBreakerConfig
    streak: list[_FaultedStep] = field(default_factory=list)

    def observe(self, trajectories: Sequence[Trajectory]) -> str | None:
        """Count one RL step's episodes; returns the one-line stop reason when the breaker trips, else None."""
        faulted = [t.failure for t in trajectories if t.failure is not None]
        fraction = len(faulted) / len(trajectories) if trajectories else 0.0
        if not fraction > self.cfg.max_fraction:
            self.streak.clear()
            return None
        example: dict[str, str] = {}
        for failure in faulted:
            example.setdefault(failure.kind, failure.detail)
        self.streak.append(_FaultedStep(fraction, dict(Counter(f.kind for f in faulted)), example))
        if len(self.streak) < self.cfg.consecutive_steps:
            return None
        return self._reason()

    def _reason(self) -> str:
        total: Counter[str] = Counter()
        for step in self.streak:
            total.update(step.kinds)
        kind, count = min(total.items(), key=lambda kv: (-kv[1], kv[0]))  # most frequent; ties by name
        example = next(s.example[kind] for s in self.streak if kind in s.example)
        example = " ".join(example.split())[:EXAMPLE_CHARS]
        fractions = ", ".join(f"{s.fraction:.0%}" for s in self.streak)
        return (
            f"stopping: more than {self.cfg.max_fraction:.0%} of the episodes faulted in each of the last "
            f"{len(self.streak)} RL steps ({fractions}); dominant failure: {kind} ({count} of "
            f"{sum(total.values())} faults, e.g. {example!r}) — fix the environment, or raise "
            f"rollout.fault_breaker.max_fraction"
        )

    def state(self) -> dict[str, object]:
        """Plain data for the resume checkpoint."""
        return {"streak": [{"fraction": s.fraction, "kinds": s.kinds, "example": s.example} for s in self.streak]}

    def load_state(self, state: Mapping[str, object]) -> None:
        """Restore :meth:`state` (an absent or empty state is a fresh breaker)."""
        rows = state.get("streak", [])
        if not isinstance(rows, list):
            raise ValueError("fault breaker state: 'streak' must be a list")
        self.streak = [_FaultedStep(float(r["fraction"]), dict(r["kinds"]), dict(r["example"])) for r in rows]
