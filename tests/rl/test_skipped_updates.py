"""A run of skipped RL updates is warned about once, naming the cause; every step logs its group make-up."""

from __future__ import annotations

from harmonyrl.rl.skipped_updates import SkippedUpdates, skip_cause
from harmonyrl.types import Failure, Trajectory


def _ep(group: int, reward: float, failed: bool = False) -> Trajectory:
    failure = Failure("tool_crash", "boom") if failed else None
    terms = {"correct": 1.0 if reward >= 1.0 else 0.0}
    return Trajectory(f"t{group}", group, (1, 2), (0, 1), (0.0, -0.1), reward, True, False, failure, (), 0, terms)


def _groups(rewards: list[list[float]]) -> list[Trajectory]:
    return [_ep(g, r) for g, rs in enumerate(rewards) for r in rs]


def test_cause_names_equal_groups_and_the_likely_reason() -> None:
    # 8 groups of 2, every episode 0: too hard
    assert skip_cause(_groups([[0.0, 0.0]] * 8)) == (
        "all 8 groups had equal rewards (every episode scored 0): the task may be too hard for the warm start "
        "(a longer SFT warm start, or an easier task, helps)"
    )
    # every episode solved: too easy
    assert "every episode succeeded: the task may be too easy" in skip_cause(_groups([[1.0, 1.0]] * 3))
    # some groups all 0, others all 1: each group alike, but the task is neither
    mixed = skip_cause(_groups([[0.0, 0.0], [1.0, 1.0]]))
    assert mixed.startswith("all 2 groups had equal rewards: ") and "rollout.group_size" in mixed
    # every episode an environment fault
    faulted = [_ep(0, 0.0, failed=True), _ep(1, 0.0, failed=True)]
    assert skip_cause(faulted).startswith("all 2 episodes were environment failures")
    # faults beside equal groups are counted too
    assert "; 1 episodes were environment failures" in skip_cause([*_groups([[0.0, 0.0]]), _ep(1, 0.0, failed=True)])


def test_warns_once_per_streak_after_three_and_sums_up() -> None:
    warnings: list[str] = []
    watch = SkippedUpdates(warn=warnings.append)
    stuck = _groups([[0.0, 0.0]] * 8)
    learning = _groups([[0.0, 1.0]] * 8)
    pattern = [1, 1, 0, 1, 1, 1, 1, 1, 0, 1]  # streaks of 2, 5 and 1: only the 5 reaches 3
    for skipped in pattern:
        metrics = watch.observe(skipped, stuck if skipped else learning)
        assert metrics["rollout/groups"] == 8.0
        assert metrics["rollout/equal_reward_groups"] == (8.0 if skipped else 0.0)
    assert len(warnings) == 1
    assert warnings[0].startswith("RL: 3 updates in a row skipped, nothing to train on: all 8 groups had equal")
    assert watch.total == 8 and watch.steps == 10
    assert watch.summary() is not None and watch.summary().startswith("RL: 8 of 10 updates skipped")  # type: ignore[union-attr]


def test_no_warning_and_no_summary_when_every_step_updates() -> None:
    warnings: list[str] = []
    watch = SkippedUpdates(warn=warnings.append)
    for _ in range(5):
        watch.observe(False, _groups([[0.0, 1.0]]))
    assert warnings == [] and watch.summary() is None
