"""Held-out evaluation with the current engine weights, two ways.

* ``eval/…`` — the policy as it acts: ``samples_per_task`` episodes per task at the sampling temperature;
  ``eval/success`` is their mean, i.e. pass@1 estimated from several samples, and ``eval/pass@k`` the
  unbiased pass@k for k = 1, 2, 4, … up to ``samples_per_task`` (RL can raise pass@1 while pass@k falls).
* ``eval_greedy/…`` — one greedy episode per task.

``eval/success_se`` and ``eval_greedy/success_se`` are their standard errors, clustered by task
(:func:`harmonyrl.telemetry.stats.clustered`: a task's samples are not independent of each other).

RL on a sparse reward mostly makes the *sampled* policy reliable (it stops guessing, copies more carefully);
greedy success moves less. Reporting both keeps either from being mistaken for the other.
"""

from __future__ import annotations

from collections.abc import Sequence

from harmonyrl.engine.base import Engine
from harmonyrl.envs.base import EnvFactory
from harmonyrl.harmony.tokenizer import Codec
from harmonyrl.rollout.agent_loop import EpisodeLimits
from harmonyrl.rollout.scheduler import group_requests
from harmonyrl.rollout.team import one_per_episode, role_metrics, run_rollouts
from harmonyrl.telemetry.metrics import summarize_rollouts
from harmonyrl.telemetry.passk import mean_pass_at_k
from harmonyrl.telemetry.stats import clustered
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
    sampled = await run_rollouts(
        engine,
        factory,
        codec,
        group_requests(tasks, samples_per_task, base_seed=seed + 7_919),
        SamplingParams(temperature=temperature, stop_ids=stops),
        limits,
        max_concurrency,
    )
    greedy = await run_rollouts(
        engine,
        factory,
        codec,
        group_requests(tasks, 1, base_seed=seed + 7_919),
        SamplingParams(temperature=0.0, stop_ids=stops),
        limits,
        max_concurrency,
    )
    by_task: dict[str, list[bool]] = {}
    for t in one_per_episode(sampled.trajectories):  # a team episode counts once
        if t.failure is None:  # environment faults are not the model's misses
            by_task.setdefault(t.task_id, []).append(t.success)
    ks = [k for k in (1, 2, 4, 8, 16) if k <= samples_per_task]
    pass_k = mean_pass_at_k(list(by_task.values()), ks) if by_task else {}
    greedy_by_task = [[float(t.success)] for t in one_per_episode(greedy.trajectories) if t.failure is None]
    return (
        _with_failure_classes(summarize_rollouts(sampled.trajectories, "eval"), "eval")
        | {f"eval/{k}": v for k, v in pass_k.items()}
        | _se("eval", [[float(x) for x in v] for v in by_task.values()])
        | _with_failure_classes(summarize_rollouts(greedy.trajectories, "eval_greedy"), "eval_greedy")
        | _se("eval_greedy", greedy_by_task)
        | role_metrics(factory, sampled.trajectories, "eval_team")  # per role, for a team env
    )


def _se(prefix: str, by_task: list[list[float]]) -> dict[str, float]:
    """``<prefix>/success_se``: the task-clustered standard error of the success rate (absent with < 2 tasks)."""
    return {f"{prefix}/success_se": clustered(by_task).se} if len(by_task) >= 2 else {}


def _with_failure_classes(metrics: dict[str, float], prefix: str) -> dict[str, float]:
    """``env/failure_<kind>`` as ``<prefix>/failure_<kind>``: the sampled and greedy passes each keep their own
    counts by class (under one ``env/`` key the greedy pass's overwrote the sampled's), and an evaluation's faults
    stay out of the RL steps' fault plot, which reads ``env/failure_*``."""
    return {f"{prefix}/{k.removeprefix('env/')}" if k.startswith("env/failure_") else k: v for k, v in metrics.items()}
