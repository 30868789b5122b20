"""Curriculum sampling: the pure functions against hand-derived values, the sampler's buckets, and a lossless
save/load of its state."""

from __future__ import annotations

import math

import pytest

from harmonyrl.config import ConfigError, load_config
from harmonyrl.rollout.curriculum import (
    Curriculum,
    CurriculumConfig,
    bucket_weights,
    open_buckets,
    opened_by_rate,
    updated_rate,
)
from harmonyrl.types import Task, Trajectory

# 3 levels × 4 tasks; level = task number // 4 + 1
TASKS = [Task(id=f"t{i}", prompt="p", answer="1", split="train") for i in range(12)]


def level(task: Task) -> int:
    return int(task.id[1:]) // 4 + 1


def _traj(task_id: str, group: int, reward: float) -> Trajectory:
    return Trajectory(task_id, group, (), (), (), reward, True, False, None, ())


def test_bucket_weights_by_hand() -> None:
    # ((0 - 0.5) / 0.25)² = 4, so the off-target buckets weigh e⁻⁴ against 1 for the one on target
    e4 = math.exp(-4)
    assert bucket_weights([0.0, 0.5, 1.0], 0.5, 0.25, 0.0) == pytest.approx(
        [e4 / (1 + 2 * e4), 1 / (1 + 2 * e4), e4 / (1 + 2 * e4)]
    )
    # floor 0.5: raw weights 0.5 + 0.5 e⁻⁴, 1, 0.5 + 0.5 e⁻⁴
    low = 0.5 + 0.5 * e4
    assert bucket_weights([0.0, 0.5, 1.0], 0.5, 0.25, 0.5) == pytest.approx(
        [low / (1 + 2 * low), 1 / (1 + 2 * low), low / (1 + 2 * low)]
    )
    # one width from the target: e⁻¹ relative to the target
    w = bucket_weights([0.5, 0.7], 0.5, 0.2, 0.0)
    assert w[1] / w[0] == pytest.approx(math.exp(-1))


def test_open_buckets_by_hand() -> None:
    assert open_buckets(0, 8, 2, 2) == 2
    assert open_buckets(5, 8, 2, 2) == 4  # 2 + 5 // 2
    assert open_buckets(100, 8, 2, 2) == 8  # never more than there are
    assert open_buckets(100, 8, 2, 0) == 2  # no widening
    assert open_buckets(0, 8, None, 0) == 8  # no schedule: all open


def test_opened_by_rate_by_hand() -> None:
    assert opened_by_rate(2, 4, 0.5, 0.4) == 3  # the hardest open bucket passes 0.4: one more opens
    assert opened_by_rate(2, 4, 0.4, 0.4) == 3  # reaching the threshold is enough
    assert opened_by_rate(2, 4, 0.39, 0.4) == 2
    assert opened_by_rate(2, 4, None, 0.4) == 2  # not measured yet
    assert opened_by_rate(4, 4, 1.0, 0.4) == 4  # never more than there are
    assert opened_by_rate(2, 4, 1.0, None) == 2  # no rule


def test_updated_rate_by_hand() -> None:
    assert updated_rate(0.5, 1.0, 0.3) == pytest.approx(0.65)
    assert updated_rate(0.2, 0.0, 1.0) == 0.0


def test_start_levels_draws_only_the_easiest_then_widens() -> None:
    cfg = CurriculumConfig(start_levels=1, widen_every=3)
    c = Curriculum(TASKS, level, cfg, seed=0)
    first = c.draw(0, 6)
    # only level 1 (t0..t3) is open, taken in split order and wrapping around
    assert [t.id for t in first] == ["t0", "t1", "t2", "t3", "t0", "t1"]
    assert {level(t) for t in c.draw(3, 40)} == {1, 2}  # step 3: a second level open
    assert c.opened == 2


def test_observe_moves_each_bucket_towards_its_groups_pass_fraction() -> None:
    c = Curriculum(TASKS, level, CurriculumConfig(ema=0.5, target=0.5), seed=0)
    trajs = [
        *(_traj("t0", 0, r) for r in (1.0, 1.0, 1.0, 1.0)),  # level 1: passed 1.0 → 0.5 + 0.5 × 0.5 = 0.75
        *(_traj("t8", 1, r) for r in (0.0, 0.0, 0.0, 0.2)),  # level 3: passed 0.0 → 0.5 − 0.5 × 0.5 = 0.25
    ]
    metrics = c.observe(trajs)
    assert c.rates == {"1": 0.75, "3": 0.25}
    assert c.rate("2") == 0.5  # unseen: the prior (the target)
    assert metrics["curriculum/rate_level_1"] == 0.75
    assert metrics["curriculum/mean_level"] == 2.0  # 4 episodes at level 1, 4 at level 3
    assert metrics["curriculum/buckets_seen"] == 2.0


def test_draws_prefer_the_bucket_nearest_the_target() -> None:
    c = Curriculum(TASKS, level, CurriculumConfig(width=0.1, floor=0.0), seed=0)
    c.rates = {"1": 1.0, "2": 0.5, "3": 0.0}  # weights e⁻²⁵ : 1 : e⁻²⁵
    assert {level(t) for t in c.draw(0, 50)} == {2}


def test_state_round_trip_continues_the_same_draws() -> None:
    cfg = CurriculumConfig()
    whole = Curriculum(TASKS, level, cfg, seed=3)
    cut = Curriculum(TASKS, level, cfg, seed=3)
    observed = [_traj("t0", 0, 1.0), _traj("t0", 0, 1.0), _traj("t5", 1, 0.0)]
    for c in (whole, cut):
        c.draw(0, 5)
        c.observe(observed)
    resumed = Curriculum(TASKS, level, cfg, seed=3)
    resumed.load(cut.state())
    assert [t.id for t in resumed.draw(1, 20)] == [t.id for t in whole.draw(1, 20)]
    assert resumed.state() == whole.state()


def test_without_difficulty_every_task_is_its_own_bucket() -> None:
    c = Curriculum(TASKS[:3], None, CurriculumConfig(), seed=0)
    c.observe([_traj("t1", 0, 1.0)])
    assert c.rates == {"t1": pytest.approx(0.65)}
    assert "curriculum/mean_level" not in c.observe([])
    with pytest.raises(ValueError, match="reports task difficulty"):
        Curriculum(TASKS, None, CurriculumConfig(start_levels=1), seed=0)


def test_open_at_opens_the_next_level_once_the_hardest_open_one_passes_and_keeps_it_open() -> None:
    cfg = CurriculumConfig(start_levels=1, open_at=0.6, ema=0.5, target=0.5)
    c = Curriculum(TASKS, level, cfg, seed=0)
    assert {level(t) for t in c.draw(0, 8)} == {1}
    c.observe([_traj("t0", 0, 1.0)] * 4)  # level 1: 0.5 + 0.5 × (1 − 0.5) = 0.75 ≥ 0.6
    assert {level(t) for t in c.draw(1, 40)} == {1, 2}
    c.observe([_traj("t4", 1, 0.0)] * 4)  # level 2: 0.5 − 0.25 = 0.25 < 0.6: level 3 stays closed
    assert {level(t) for t in c.draw(2, 40)} == {1, 2}
    c.observe([_traj("t0", 2, 0.0)] * 4)  # level 1 falls to 0.375: level 2 stays open all the same
    c.draw(3, 1)
    assert c.opened == 2 and c.state()["unlocked"] == 2


def test_open_at_state_survives_a_resume_and_old_states_load() -> None:
    cfg = CurriculumConfig(start_levels=1, open_at=0.6, ema=1.0)
    c = Curriculum(TASKS, level, cfg, seed=0)
    c.draw(0, 4)
    c.observe([_traj("t0", 0, 1.0)])
    resumed = Curriculum(TASKS, level, cfg, seed=0)
    resumed.load(c.state())
    assert resumed.draw(1, 30) == c.draw(1, 30) and c.opened == resumed.opened == 2
    old = {k: v for k, v in c.state().items() if k != "unlocked"}  # written before open_at existed
    fresh = Curriculum(TASKS, level, cfg, seed=0)
    fresh.load(old)
    assert fresh.unlocked == 0


def test_open_at_needs_start_levels_a_one_line_config_error() -> None:
    with pytest.raises(ConfigError, match=r"open_at needs rl\.curriculum\.start_levels") as caught:
        load_config(None, ["env.levels=[0,2]", "rl.curriculum.open_at=0.5"])
    assert "\n" not in str(caught.value)
