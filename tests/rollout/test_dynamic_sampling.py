"""Dynamic sampling: which groups are uniform, how extra groups are drawn and seeded, and that off changes nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from harmonyrl.rollout.sampling import SampledStep, SamplingConfig, keep_informative, sample_step, uniform_groups
from harmonyrl.rollout.scheduler import EpisodeRequest, RolloutResult, group_requests
from harmonyrl.rollout.task_stream import SequentialTasks
from harmonyrl.types import Failure, Task, Trajectory

TASKS = [Task(id=f"t{i}", prompt=f"p{i}", answer="1", split="train") for i in range(40)]


def _traj(group: int, reward: float, task_id: str = "t", failed: bool = False) -> Trajectory:
    failure = Failure("env_error", "boom") if failed else None
    return Trajectory(task_id, group, (), (), (), reward, True, False, failure, ())


def test_uniform_groups_are_those_with_one_healthy_reward_or_none() -> None:
    trajs = [
        _traj(0, 1.0), _traj(0, 1.0),                    # all solved: uniform
        _traj(1, 0.0), _traj(1, 1.0),                    # mixed: informative
        _traj(2, 0.0), _traj(2, 1.0, failed=True),       # the 1.0 is a fault, not a reward: uniform
        _traj(3, 0.0, failed=True), _traj(3, 0.0, failed=True),  # nothing healthy: uniform
    ]  # fmt: skip
    assert uniform_groups(trajs) == {0, 2, 3}
    assert keep_informative(trajs, 4) == (trajs[2], trajs[3])


def test_keep_informative_takes_the_first_groups_by_id() -> None:
    trajs = [_traj(g, r) for g in (0, 1, 2, 3) for r in (0.0, 1.0)]
    assert [t.group_id for t in keep_informative(trajs, 2)] == [0, 0, 1, 1]


class FakeRun:
    """Runs requests without an engine: a task's episodes all pass when its number is in ``solved_all``, all fail
    when in ``failed_all``, else alternate 0/1. Records every call's requests."""

    def __init__(self, solved_all: set[int], failed_all: set[int]) -> None:
        self.solved_all, self.failed_all = solved_all, failed_all
        self.calls: list[list[EpisodeRequest]] = []

    async def __call__(self, requests: Sequence[EpisodeRequest]) -> RolloutResult:
        self.calls.append(list(requests))
        out = []
        for i, req in enumerate(requests):
            n = int(req.task.id[1:])
            reward = 1.0 if n in self.solved_all else 0.0 if n in self.failed_all else float(i % 2)
            out.append(_traj(req.group_id, reward, req.task.id))
        return RolloutResult(tuple(out), 1.0)


def _sample(run: FakeRun, cfg: SamplingConfig, step: int = 3) -> tuple[SampledStep, SequentialTasks]:
    source = SequentialTasks(TASKS, cursor=step * 4)
    result = asyncio.run(sample_step(run, source, step, 4, 2, 77, cfg))
    return result, source


def test_off_is_one_round_of_the_old_requests_and_trains_on_everything() -> None:
    run = FakeRun(solved_all={12, 13}, failed_all=set())
    result, source = _sample(run, SamplingConfig())
    # the request list of the loop before dynamic sampling: tasks 12..15 (step 3 × 4), seeds from base seed 77
    assert run.calls == [group_requests(TASKS[12:16], 2, base_seed=77)]
    assert result.trained == result.rollout.trajectories
    assert result.metrics == {}
    assert source.cursor == 16


def test_on_refills_with_the_next_tasks_and_their_seeds() -> None:
    # step 3 draws tasks 12..15; 12 and 13 are solved by every episode (uniform), so 2 groups are missing:
    # round 2 draws tasks 16, 17; 16 is failed by every episode (uniform), so 1 is missing: round 3 draws 18.
    run = FakeRun(solved_all={12, 13}, failed_all={16})
    result, source = _sample(run, SamplingConfig(filter_uniform_groups=True, max_extra_groups=8))
    everything = group_requests(TASKS[12:19], 2, base_seed=77)
    assert run.calls == [everything[:8], everything[8:12], everything[12:14]]
    assert [t.group_id for t in result.trained] == [2, 2, 3, 3, 5, 5, 6, 6]
    assert result.metrics == {
        "sampling/dropped_groups": 3.0,
        "sampling/extra_groups": 3.0,
        "sampling/extra_rollouts": 6.0,
        "sampling/batch_fill": 1.0,
        "sampling/rounds": 3.0,
    }
    assert source.cursor == 19


def test_the_cap_bounds_the_extra_groups() -> None:
    # every task uniform: round 2 asks for 4 more, capped at 3; then the cap is spent
    run = FakeRun(solved_all=set(range(40)), failed_all=set())
    result, _ = _sample(run, SamplingConfig(filter_uniform_groups=True, max_extra_groups=3))
    assert [len(c) for c in run.calls] == [8, 6]
    assert result.trained == ()
    assert result.metrics["sampling/extra_rollouts"] == 6.0
    assert result.metrics["sampling/batch_fill"] == 0.0
    assert result.metrics["sampling/dropped_groups"] == 7.0
