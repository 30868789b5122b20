"""Dynamic sampling (DAPO): refill the batch with groups that carry a learning signal.

A group whose healthy episodes all earned the same reward (all solved, or all failed) has a group-relative
advantage of 0: it trains nothing, and the learner drops it (``rl.skip_zero_variance_groups``), so the step
trains on fewer groups than ``rollout.tasks_per_step``. With ``rl.sampling.filter_uniform_groups`` the step
draws more tasks from its task source, in rounds, until ``tasks_per_step`` informative groups are in hand or
``max_extra_groups`` extra groups have been run; the learner gets the first ``tasks_per_step`` informative
groups (all of them, if the cap was hit first). Each round asks for exactly as many groups as are still
missing (capped): no episode is run that the batch could not use.

Every sampled episode still counts in the rollout metrics, the records and the fault breaker; only the
learner's batch is filtered. Extra groups take the next group ids, so their seeds follow from the step's base
seed exactly like the first round's (:func:`~harmonyrl.rollout.scheduler.group_requests`), and their tasks come
from the step's task source, whose position is checkpointed: a resumed run draws the same extra tasks.
A group with no healthy episode at all (every episode an environment fault) counts as uniform.

Off (the default) the step is one round of ``tasks_per_step`` groups and the learner gets every episode:
exactly the step of a run without this feature.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from pydantic import Field

from harmonyrl.frozen import Frozen
from harmonyrl.rollout.scheduler import EpisodeRequest, RolloutResult, group_requests
from harmonyrl.rollout.task_stream import TaskSource
from harmonyrl.types import Task, Trajectory


class SamplingConfig(Frozen):
    """Dynamic sampling (``rl.sampling``): refill the batch past groups with equal rewards (docs/curriculum.md)."""

    filter_uniform_groups: bool = False
    """Drop groups whose rewards are all equal and run extra groups to keep ``rollout.tasks_per_step`` informative
    ones per step (DAPO's dynamic sampling). Metrics: ``sampling/*``."""
    max_extra_groups: int = Field(8, ge=0)
    """Cap on the groups one step may run beyond ``rollout.tasks_per_step`` (each costs ``rollout.group_size``
    episodes)."""


RunRequests = Callable[[Sequence[EpisodeRequest]], Awaitable[RolloutResult]]
"""Runs episode requests against the engine (``run_episodes`` with the step's engine, env and limits bound)."""


@dataclass(frozen=True)
class SampledStep:
    """One step's episodes: every one sampled, and the ones the learner trains on."""

    rollout: RolloutResult
    """Every episode sampled this step (first round and extra groups), in group order."""
    trained: tuple[Trajectory, ...]
    """What the learner gets: every episode when filtering is off, else the kept informative groups."""
    metrics: dict[str, float]
    """``sampling/*`` counters (empty when filtering is off)."""


def uniform_groups(trajectories: Sequence[Trajectory]) -> set[int]:
    """Group ids whose healthy (non-failed) episodes all have one reward, or that have no healthy episode."""
    rewards: dict[int, set[float]] = {}
    for t in trajectories:
        seen = rewards.setdefault(t.group_id, set())
        if t.failure is None:
            seen.add(t.reward)
    return {g for g, values in rewards.items() if len(values) < 2}


def keep_informative(trajectories: Sequence[Trajectory], want: int) -> tuple[Trajectory, ...]:
    """The episodes of the first ``want`` non-uniform groups (by group id), in their original order."""
    uniform = uniform_groups(trajectories)
    informative = sorted({t.group_id for t in trajectories} - uniform)[:want]
    kept = set(informative)
    return tuple(t for t in trajectories if t.group_id in kept)


def _merge(parts: Sequence[RolloutResult]) -> RolloutResult:
    """One rollout result from several rounds: episodes concatenated, wall time and retries summed."""
    return RolloutResult(
        tuple(t for p in parts for t in p.trajectories),
        sum(p.wall_s for p in parts),
        sum(p.group_retries for p in parts),
        sum(p.retried_episodes for p in parts),
    )


async def sample_step(
    run: RunRequests,
    source: TaskSource,
    step: int,
    tasks_per_step: int,
    group_size: int,
    base_seed: int,
    cfg: SamplingConfig,
) -> SampledStep:
    """Run RL step ``step``'s groups: ``tasks_per_step`` from ``source``, then (filtering on) extra rounds until
    the batch is full of informative groups or the cap is reached. Seeds: :func:`group_requests` over every task
    the step ran, so group ``g`` gets the same seeds whichever round ran it."""
    tasks: list[Task] = source.draw(step, tasks_per_step)
    parts = [await run(group_requests(tasks, group_size, base_seed))]
    if not cfg.filter_uniform_groups:
        return SampledStep(parts[0], parts[0].trajectories, {})
    rounds = 1
    while True:
        sampled = [t for p in parts for t in p.trajectories]
        missing = tasks_per_step - (len(tasks) - len(uniform_groups(sampled)))
        budget = tasks_per_step + cfg.max_extra_groups - len(tasks)
        if missing <= 0 or budget <= 0:
            break
        first = len(tasks)
        tasks += source.draw(step, min(missing, budget))
        parts.append(await run(group_requests(tasks, group_size, base_seed)[first * group_size :]))
        rounds += 1
    rollout = _merge(parts)
    trained = keep_informative(rollout.trajectories, tasks_per_step)
    n_uniform = len(uniform_groups(rollout.trajectories))
    extra = len(tasks) - tasks_per_step
    metrics = {
        "sampling/dropped_groups": float(n_uniform),
        "sampling/extra_groups": float(extra),
        "sampling/extra_rollouts": float(extra * group_size),
        "sampling/batch_fill": len({t.group_id for t in trained}) / tasks_per_step,
        "sampling/rounds": float(rounds),
    }
    return SampledStep(rollout, trained, metrics)
