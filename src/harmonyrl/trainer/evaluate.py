"""Held-out evaluation: one episode per task with the current engine weights."""

from __future__ import annotations

from collections.abc import Sequence

from harmonyrl.engine.base import Engine
from harmonyrl.envs.base import EnvFactory
from harmonyrl.harmony.tokenizer import Codec
from harmonyrl.rollout.agent_loop import EpisodeLimits
from harmonyrl.rollout.scheduler import group_requests, run_episodes
from harmonyrl.telemetry.metrics import summarize_rollouts
from harmonyrl.types import SamplingParams, Task


async def evaluate(
    engine: Engine,
    factory: EnvFactory,
    codec: Codec,
    tasks: Sequence[Task],
    limits: EpisodeLimits,
    temperature: float,
    seed: int,
    max_concurrency: int = 64,
) -> dict[str, float]:
    """Success and behaviour metrics (``eval/`` namespace) over ``tasks``; greedy when temperature is 0."""
    params = SamplingParams(temperature=temperature, stop_ids=(codec.special.call, codec.special.return_))
    requests = group_requests(tasks, 1, base_seed=seed + 7_919)
    result = await run_episodes(engine, factory, codec, requests, params, limits, max_concurrency)
    return summarize_rollouts(result.trajectories, prefix="eval")
