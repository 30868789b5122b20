"""Runs many episodes concurrently against one engine.

Every episode is its own asyncio task, so while one waits for a tool the engine keeps decoding the others
(continuous batching does the rest). An exception inside an episode — the environment's fault by
definition, since model faults are observations — becomes a typed ``env_error`` failure for that episode
only: one failing episode never aborts a step.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass

from harmonyrl.engine.base import Engine
from harmonyrl.envs.base import EnvFactory
from harmonyrl.harmony.tokenizer import Codec
from harmonyrl.rollout.agent_loop import EpisodeLimits, run_episode
from harmonyrl.types import Failure, SamplingParams, Task, Trajectory


@dataclass(frozen=True)
class EpisodeRequest:
    task: Task
    group_id: int
    seed: int


@dataclass(frozen=True)
class RolloutResult:
    trajectories: tuple[Trajectory, ...]
    wall_s: float


def _failed(req: EpisodeRequest, exc: BaseException) -> Trajectory:
    return Trajectory(
        task_id=req.task.id,
        group_id=req.group_id,
        token_ids=(),
        loss_mask=(),
        sampler_logprobs=(),
        reward=0.0,
        terminated=False,
        truncated=False,
        failure=Failure("env_error", f"{type(exc).__name__}: {exc}"[:500]),
        turns=(),
    )


async def _one(
    engine: Engine,
    factory: EnvFactory,
    codec: Codec,
    params: SamplingParams,
    limits: EpisodeLimits,
    req: EpisodeRequest,
    gate: asyncio.Semaphore,
) -> Trajectory:
    async with gate:
        env = None
        try:
            env = factory.make(req.task)
            return await run_episode(
                engine, env, codec, params, limits, task_id=req.task.id, group_id=req.group_id, seed=req.seed
            )
        except Exception as exc:  # the env's fault: mask this episode, keep the step
            return _failed(req, exc)
        finally:
            if env is not None:
                # a failing close must not turn a finished episode into a lost one
                with contextlib.suppress(Exception):
                    await env.close()


async def run_episodes(
    engine: Engine,
    factory: EnvFactory,
    codec: Codec,
    requests: Sequence[EpisodeRequest],
    params: SamplingParams,
    limits: EpisodeLimits,
    max_concurrency: int,
) -> RolloutResult:
    """Run all ``requests`` with at most ``max_concurrency`` episodes in flight; results keep request order."""
    gate = asyncio.Semaphore(max_concurrency)
    t0 = time.perf_counter()
    trajs = await asyncio.gather(*(_one(engine, factory, codec, params, limits, r, gate) for r in requests))
    return RolloutResult(tuple(trajs), time.perf_counter() - t0)


def group_requests(tasks: Sequence[Task], group_size: int, base_seed: int) -> list[EpisodeRequest]:
    """``group_size`` episodes per task; seeds derive from the position so runs are reproducible."""
    return [
        EpisodeRequest(task, g, base_seed * 1_000_003 + g * group_size + i)
        for g, task in enumerate(tasks)
        for i in range(group_size)
    ]
