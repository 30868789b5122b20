"""A run's clock continues from the seconds its checkpoint recorded; an older checkpoint starts it at 0."""

from __future__ import annotations

from pathlib import Path

from harmonyrl.run.clock import RunClock
from harmonyrl.run.resume import Progress
from harmonyrl.run.state import Rngs, RunState


def _saved(state: dict[str, object]) -> Progress:
    plain = {"phase": "rl", "step": 3, "lines": {}, "optimizer": {}, "learner": {}, **Rngs.capture().to_plain()}
    return Progress(RunState.from_plain(plain | state, "unused"), Path("unused"))


def test_a_resumed_clock_adds_the_recorded_seconds_to_its_own() -> None:
    clock = RunClock(start=100.0)
    assert clock.resumed_from(_saved({"elapsed_s": 5400.0})) == RunClock(5400.0, 100.0)
    assert RunClock(5400.0).minutes() >= 90.0


def test_a_fresh_run_or_an_older_checkpoint_counts_only_this_process() -> None:
    clock = RunClock(start=100.0)
    assert clock.resumed_from(None) == RunClock(0.0, 100.0)
    assert clock.resumed_from(_saved({})) == RunClock(0.0, 100.0)
    assert clock.resumed_from(_saved({"elapsed_s": "garbled"})) == RunClock(0.0, 100.0)
