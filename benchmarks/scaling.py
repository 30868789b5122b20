"""Env workers on Ray: episodes/s with 1, 2, 4 and 8 workers when every tool call is slow but CPU-light.

Every episode is reset, one tool call that sleeps ``--tool-s`` (a blocking ``time.sleep`` in a sync tool, as a
slow API or a remote service would block) and a graded final answer. The policy is scripted (it calls the tool
with the task's expression, then answers with the result), so the engine costs nothing and what is measured is
the env side: the driver's agent loops sending ``reset``/``step``/``close`` to the workers, and the workers
running them.

**One worker** handles one env call at a time (``scale.worker_concurrency=1``): it is the serial baseline, and
N workers can at best be N times as fast. Each configuration runs ``--episodes-per-worker`` × N episodes, all
submitted at once (least-loaded assignment gives every worker the same number), after a warm-up episode per
worker; the workers reserve ``2 / 8`` CPU each, so the 8-worker pool fits this 2-core machine's local cluster.
Efficiency at N workers = episodes/s ÷ (N × one worker's episodes/s); ``of_ideal`` = episodes/s ÷ (N / tool_s),
against workers that would only ever sleep in the tool (on a loaded machine the one-worker baseline is noisy).

For context the same episodes also run without Ray, in this process (``in-process``): sync tools run on the
tool thread pool, so sleep-bound calls already overlap there. Ray workers are for env work that needs other
machines' CPUs, memory, sandboxes or isolation, not for overlapping sleeps on one machine.

Last line: ``RESULT workers=1,2,4,8 episodes_per_s=… efficiency_at_8=…``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import time
from collections.abc import Sequence
from typing import Literal

from harmonyrl.config import ScaleConfig
from harmonyrl.distributed.ray_cluster import import_ray, start_env_pool
from harmonyrl.envs.base import EnvFactory
from harmonyrl.envs.reward import OUTCOME_ONLY, AnswerEnv
from harmonyrl.envs.tools import Tool, Toolbox
from harmonyrl.harmony.render import render_completion
from harmonyrl.harmony.tokenizer import HarmonyTokenizer
from harmonyrl.rollout.agent_loop import EpisodeLimits
from harmonyrl.rollout.scheduler import group_requests, run_episodes
from harmonyrl.tasks.calculator import INSTRUCTIONS, calculator, expression_of, generate_tasks
from harmonyrl.types import Generation, Message, SamplingParams, Task


class SleepyCalculatorFactory:
    """Calculator tasks whose tool blocks for ``tool_s`` seconds before it computes."""

    name = "sleepy_calculator"

    def __init__(self, tool_s: float, n_tasks: int) -> None:
        self._tasks, _ = generate_tasks(0, n_tasks, 1)

        def slow(expression: str) -> str:
            """Evaluate an arithmetic expression (slowly).

            Args:
                expression: Integer arithmetic, e.g. "347 * 28 + 1191".
            """
            time.sleep(tool_s)
            return calculator(expression)

        slow.__name__ = "calculator"
        self._toolbox = Toolbox([Tool.from_function(slow, timeout_s=tool_s + 30.0)])

    def tasks(self, split: Literal["train", "test"]) -> Sequence[Task]:
        return self._tasks

    def make(self, task: Task) -> AnswerEnv:
        return AnswerEnv(task, self._toolbox, INSTRUCTIONS, OUTCOME_ONLY)


class ScriptedSolver:
    """An engine that calls the calculator with the task's expression, then answers with the tool's result."""

    def __init__(self, tok: HarmonyTokenizer, tasks: Sequence[Task]) -> None:
        self.tok, self.by_prompt = tok, {t.prompt: t for t in tasks}

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        text = self.tok.decode(list(prompt_ids))
        task = next(t for p, t in self.by_prompt.items() if p in text)
        if "<|call|>" in text:
            msg = Message("assistant", task.answer, "final")
        else:
            args = json.dumps({"expression": expression_of(task)})
            msg = Message("assistant", args, "commentary", "functions.calculator", content_type="json")
        ids = render_completion(self.tok, [msg])
        return Generation(tuple(ids), (0.0,) * len(ids), "stop")

    def load_weights(self, state_dict: object) -> None: ...

    async def close(self) -> None: ...


async def episodes_per_s(factory: EnvFactory, tok: HarmonyTokenizer, tasks: Sequence[Task], warmup: int) -> float:
    """Run ``warmup`` episodes, then time all of ``tasks`` at once; every episode must succeed."""
    params = SamplingParams(stop_ids=(tok.special.call, tok.special.return_))
    limits = EpisodeLimits(max_turns=3, max_new_tokens=256, max_seq_len=2048, timeout_s=None)
    engine = ScriptedSolver(tok, tasks)
    await run_episodes(engine, factory, tok, group_requests(tasks[:warmup], 1, 0), params, limits, 10_000)
    t0 = time.perf_counter()
    result = await run_episodes(engine, factory, tok, group_requests(tasks, 1, 0), params, limits, 10_000)
    wall = time.perf_counter() - t0
    bad = [t for t in result.trajectories if t.failure is not None or t.reward != 1.0]
    if bad:
        raise RuntimeError(f"{len(bad)} episodes failed, e.g. {bad[0].failure}")
    return len(tasks) / wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="1,2,4,8")
    ap.add_argument("--tool-s", type=float, default=0.5, help="seconds every tool call sleeps")
    ap.add_argument("--episodes-per-worker", type=int, default=16)
    ap.add_argument("--cpus", type=int, default=2, help="logical CPUs of the local Ray cluster")
    args = ap.parse_args()
    counts = [int(n) for n in args.workers.split(",")]
    tok = HarmonyTokenizer.load_default()
    recipe = functools.partial(SleepyCalculatorFactory, args.tool_s, args.episodes_per_worker * max(counts))
    local = recipe()
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} cores)")

    ray = import_ray()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    t0 = time.perf_counter()
    ray.init(num_cpus=args.cpus, include_dashboard=False, logging_level="WARNING")
    print(f"local Ray cluster up in {time.perf_counter() - t0:.1f} s")
    rates: dict[int, float] = {}
    for n in counts:
        # a loaded machine starts 8 workers (each imports harmonyrl and torch) slowly: no start-up bound here
        scale = ScaleConfig(
            ray=True, env_workers=n, worker_cpus=args.cpus / max(counts), worker_concurrency=1, start_timeout_s=900
        )
        t0 = time.perf_counter()
        factory = start_env_pool(scale, recipe, local)
        started = time.perf_counter() - t0
        tasks = local.tasks("train")[: n * args.episodes_per_worker]
        rates[n] = asyncio.run(episodes_per_s(factory, tok, tasks, warmup=n))
        factory.pool.close()
        eff = rates[n] / (n * rates[counts[0]] / counts[0])
        ideal = rates[n] / (n / args.tool_s)  # against N workers that only ever sleep in the tool
        print(f"workers={n}  episodes={len(tasks)}  episodes/s={rates[n]:6.2f}  efficiency={eff:.2f}  "
              f"of_ideal={ideal:.2f}  (pool start {started:.1f} s)", flush=True)  # fmt: skip
    ray.shutdown()
    tasks = local.tasks("train")[: max(counts) * args.episodes_per_worker]
    in_process = asyncio.run(episodes_per_s(local, tok, tasks, warmup=1))
    print(
        f"in-process (no Ray, all {len(tasks)} episodes overlapping on the tool threads): {in_process:.2f} episodes/s"
    )
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    serial = rates[counts[0]] / counts[0]
    eff_last = rates[counts[-1]] / (counts[-1] * serial)
    print(
        f"RESULT workers={','.join(map(str, counts))} "
        f"episodes_per_s={','.join(f'{rates[n]:.2f}' for n in counts)} efficiency_at_{counts[-1]}={eff_last:.2f}"
    )


if __name__ == "__main__":
    main()
