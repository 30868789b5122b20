"""The circuit breaker: trips only when more than ``max_fraction`` of the episodes fault for N steps in a row."""

from __future__ import annotations

import random

from harmonyrl.config import FaultBreakerConfig
from harmonyrl.rl.fault_breaker import FaultBreaker
from harmonyrl.types import Failure, Trajectory


def episodes(n: int, faults: dict[str, int]) -> list[Trajectory]:
    kinds = [k for k, c in faults.items() for _ in range(c)]
    return [
        Trajectory(f"t{i}", i, (), (), (), 0.0, False, False, Failure(kinds[i], f"{kinds[i]} #{i}") if i < len(kinds)
                   else None, ())
        for i in range(n)
    ]  # fmt: skip


def test_trips_after_n_consecutive_faulted_steps_naming_the_dominant_class() -> None:
    breaker = FaultBreaker(FaultBreakerConfig(max_fraction=0.5, consecutive_steps=3))
    assert breaker.observe(episodes(8, {"env_error": 8})) is None
    assert breaker.observe(episodes(8, {"env_error": 5, "tool_timeout": 2})) is None
    reason = breaker.observe(episodes(8, {"tool_timeout": 6}))
    assert reason is not None and "\n" not in reason
    # env_error 13 of 21 faults over the three steps; fractions 8/8, 7/8, 6/8
    assert "each of the last 3 RL steps (100%, 88%, 75%)" in reason
    assert "dominant failure: env_error (13 of 21 faults, e.g. 'env_error #0')" in reason


def test_a_healthy_step_resets_the_streak_and_exactly_the_fraction_does_not_count() -> None:
    breaker = FaultBreaker(FaultBreakerConfig(max_fraction=0.5, consecutive_steps=2))
    assert breaker.observe(episodes(4, {"env_error": 4})) is None
    assert breaker.observe(episodes(4, {"env_error": 2})) is None  # 50 % is not *more than* 50 %
    assert breaker.observe(episodes(4, {"env_error": 3})) is None  # the streak started again
    assert breaker.observe(episodes(4, {"env_error": 3})) is not None


def test_twenty_percent_faults_never_trip_the_default_breaker() -> None:
    """The README demo's fault rate: each episode faults with probability 0.2 (worse than 20 % of tool calls)."""
    rng = random.Random(0)
    breaker = FaultBreaker(FaultBreakerConfig())
    for _ in range(500):
        n_faulted = sum(rng.random() < 0.2 for _ in range(128))
        assert breaker.observe(episodes(128, {"tool_crash": n_faulted})) is None
    assert breaker.streak == []


def test_state_round_trips_so_a_resumed_run_stops_at_the_same_step() -> None:
    a = FaultBreaker(FaultBreakerConfig(consecutive_steps=3))
    a.observe(episodes(4, {"env_error": 4}))
    a.observe(episodes(4, {"sandbox_error": 4}))
    b = FaultBreaker(FaultBreakerConfig(consecutive_steps=3))
    b.load_state(a.state())
    assert a.observe(episodes(4, {"env_error": 4})) == b.observe(episodes(4, {"env_error": 4})) is not None
