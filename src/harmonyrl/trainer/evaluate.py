"""Held-out evaluation with the current engine weights, two ways.

* ``eval/…`` — the policy as it acts: ``samples_per_task`` episodes per task at the sampling temperature;
  ``eval/success`` is their mean, i.e. pass@1 estimated from several samples.
* ``eval_greedy/…`` — one greedy episode per task.

RL on a sparse reward mostly makes the *sampled* policy reliable (it stops guessing, copies more carefully);
greedy success moves less. Reporting both keeps either from being mistaken for the other.
"""

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
    samples_per_task: int,
    seed: int,
    max_concurrency: int = 128,
) -> dict[str, float]:
    """``eval/`` (sampled) and ``eval_greedy/`` success and behaviour metrics over ``tasks``."""
    stops = (codec.special.call, codec.special.return_)
    sampled = await run_episodes(
        engine,
        factory,
        codec,
        group_requests(tasks, samples_per_task, base_seed=seed + 7_919),
        SamplingParams(temperature=temperature, stop_ids=stops),
        limits,
        max_concurrency,
    )
    greedy = await run_episodes(
        engine,
        factory,
        codec,
        group_requests(tasks, 1, base_seed=seed + 7_919),
        SamplingParams(temperature=0.0, stop_ids=stops),
        limits,
        max_concurrency,
    )
    return summarize_rollouts(sampled.trajectories, "eval") | summarize_rollouts(greedy.trajectories, "eval_greedy")
