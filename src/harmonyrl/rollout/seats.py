"""Seated team episodes: the seats of one game, each its own episode of the shared policy, played at the same time.

A :class:`~harmonyrl.envs.team.SeatedTeam` (a two-player game in self-play) cannot be run role after role like a
relay (:mod:`harmonyrl.rollout.team`): its seats take turns inside one game, each seat's ``move`` waiting for the
other seat's reply. So every request's seats run together — one :func:`~harmonyrl.rollout.scheduler.run_episodes`
per seat, gathered — and a request takes all its seats' concurrency slots at once (``max_concurrency // seats``
requests in flight, at least one), so a seat is never left waiting for a teammate that cannot start.

**Rewards.** Each seat keeps its own (a win for one seat is a loss for the other), its reward terms and
``team_role`` (the seat's index, how per-seat metrics find it). All seats of a request keep its ``group_id``: in a
zero-sum game the group's mean is the draw value, so each seat's group-relative advantage is its own result against
that — one shared policy learns from both sides of every game.

**Faults.** A seat's fault (the game raising, a timeout) masks every seat of that request: a game whose outcome was
never decided is nobody's 0. With ``retry_faulted_groups`` = N, such requests are played again (all seats, same
seeds), up to N rounds. A harness error in one seat cancels the others and propagates.

Seeds: seat ``i`` samples with :func:`~harmonyrl.rollout.role_seeds.role_seed`, as a relay's role ``i`` does.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import replace

from harmonyrl.engine.base import Engine
from harmonyrl.envs.team import SeatedTeam
from harmonyrl.harmony.tokenizer import Codec
from harmonyrl.rollout.agent_loop import EpisodeLimits
from harmonyrl.rollout.role_seeds import role_seed
from harmonyrl.rollout.scheduler import EpisodeRequest, RolloutResult, run_episodes
from harmonyrl.types import ROLE_TERM, SamplingParams, Trajectory


def seat_outcomes(seats: Sequence[Trajectory]) -> tuple[Trajectory, ...]:
    """One request's seats, each tagged with its index; a fault at one seat masks them all."""
    failure = next((t.failure for t in seats if t.failure is not None), None)
    out = []
    for i, t in enumerate(seats):
        terms = {**t.reward_terms, ROLE_TERM: float(i)}
        if failure is None:
            out.append(replace(t, reward_terms=terms))
        else:  # kept for the record, never trained on
            out.append(replace(t, reward=0.0, reward_terms=terms, failure=t.failure or failure))
    return tuple(out)


async def _play(
    engine: Engine,
    team: SeatedTeam,
    codec: Codec,
    req: EpisodeRequest,
    params: SamplingParams,
    limits: EpisodeLimits,
) -> tuple[Trajectory, ...]:
    """One request: a fresh table, every seat's episode at once (a TaskGroup: one seat's harness error cancels
    the others rather than leaving them waiting for its move)."""
    seats = team.table(req.task)
    async with asyncio.TaskGroup() as group:
        requests = [EpisodeRequest(req.task, req.group_id, role_seed(req.seed, i)) for i in range(len(seats))]
        runs = [
            group.create_task(run_episodes(engine, seat, codec, [one], params, limits, 1))
            for seat, one in zip(seats, requests, strict=True)
        ]
    return seat_outcomes([r.result().trajectories[0] for r in runs])


async def run_seated_episodes(
    engine: Engine,
    team: SeatedTeam,
    codec: Codec,
    requests: Sequence[EpisodeRequest],
    params: SamplingParams,
    limits: EpisodeLimits,
    max_concurrency: int,
    retry_faulted_groups: int = 0,
) -> RolloutResult:
    """Every request's game, its seats at once (module docstring); trajectories request by request, seats in order."""
    t0 = time.perf_counter()
    gate = asyncio.Semaphore(max(1, max_concurrency // max(1, len(team.roles))))

    async def one(req: EpisodeRequest) -> tuple[Trajectory, ...]:
        async with gate:
            return await _play(engine, team, codec, req, params, limits)

    async def batch(reqs: Sequence[EpisodeRequest]) -> list[tuple[Trajectory, ...]]:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(one(r)) for r in reqs]
        return [t.result() for t in tasks]

    games = await batch(requests)
    group_retries = retried = 0
    for _ in range(retry_faulted_groups):
        redo = [j for j, seats in enumerate(games) if any(t.failure is not None for t in seats)]
        if not redo:
            break
        group_retries += len({requests[j].group_id for j in redo})
        retried += sum(len(games[j]) for j in redo)
        for j, seats in zip(redo, await batch([requests[j] for j in redo]), strict=True):
            games[j] = seats
    trajectories = tuple(t for seats in games for t in seats)
    return RolloutResult(trajectories, time.perf_counter() - t0, group_retries, retried)
