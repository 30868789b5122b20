"""A run's wall-clock time across resumes, for its ``summary.json``.

Every ``checkpoints/last`` records the seconds the run had spent when it was written (``elapsed_s`` in its
state), and a resumed run's clock starts from there. The time a killed process spent after its last checkpoint is
not counted: that work is done again by the resumed process, and counted then. A checkpoint written before
``elapsed_s`` existed starts the clock at 0 (the summary then counts only the resumed part).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from harmonyrl.run.resume import Progress


@dataclass(frozen=True)
class RunClock:
    """Seconds spent by the run: ``before_s`` by earlier processes (up to their last checkpoint), plus this one's
    since ``start`` (a ``time.perf_counter`` reading)."""

    before_s: float = 0.0
    start: float = field(default_factory=time.perf_counter)

    def seconds(self) -> float:
        return self.before_s + time.perf_counter() - self.start

    def minutes(self) -> float:
        return self.seconds() / 60

    def resumed_from(self, saved: Progress | None) -> RunClock:
        """This clock, counting also the seconds recorded in ``saved`` (none for a fresh run)."""
        before = saved.state.parts.elapsed_s if saved is not None else None
        return RunClock(before or 0.0, self.start)
