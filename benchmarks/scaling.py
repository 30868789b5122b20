"""Env workers on Ray: episodes/s with 1, 2, 4 and 8 workers, for a sleep-bound and a CPU-bound tool, beside the
in-process path.

Every episode is reset, one tool call and a graded final answer. Two tools:

* ``sleep`` — the call sleeps ``--tool-s`` (a blocking ``time.sleep`` in a sync tool, as a slow API or a remote
  service would block): CPU-light, so workers overlap their waits;
* ``cpu`` — the call computes: a fixed pure-Python loop, sized once at start-up to take about ``--cpu-s`` on this
  machine with nothing else running (the same work in every configuration): it holds its process's GIL and a
  core, so it scales with cores, not workers.

The policy is scripted (it calls the tool with the task's expression, then answers with the result), so the engine
costs nothing and what is measured is the env side: the driver's agent loops sending ``reset``/``step``/``close``
to the workers, and the workers running them.

**One worker** handles one env call at a time (``scale.worker_concurrency=1``): it is the serial baseline, and
N workers can at best be N times as fast. Each configuration runs ``--episodes-per-worker`` × N episodes, all
submitted at once (least-loaded assignment gives every worker the same number), after a warm-up episode per
worker; the workers reserve ``cpus / max workers`` CPU each, so the 8-worker pool fits a 2-core machine's local
cluster. Efficiency at N workers = episodes/s ÷ (N × one worker's episodes/s); ``of_ideal`` = episodes/s ÷ the
ideal (sleep: N / tool_s, workers that would only ever sleep; cpu: min(N, cores) / (one call's idle-machine
seconds)). Efficiency above 1 means the one-worker baseline ran below its own ideal, so both are reported.

**In-process** (a row of the table, no Ray): the same episodes in this process, all at once, sync tools on the
tool thread pool: sleep-bound calls overlap there already (often faster than 8 Ray workers), CPU-bound calls are
serialised by the GIL. Ray workers are for env work that needs other cores or machines, memory, sandboxes or
isolation, not for overlapping sleeps on one machine.

Last line: ``RESULT workers=1,2,4,8 episodes_per_s=… efficiency_at_8=… of_ideal_at_8=… in_process_vs_8=…
cpu_episodes_per_s=… cpu_efficiency_at_8=… cpu_of_ideal_at_8=… cpu_in_process_vs_8=… cores=…`` (``*_vs_8``:
in-process episodes/s over the largest pool's). ``--quick``: 1 and 2 workers, short tools, few episodes (a smoke
test); ``--tools sleep`` or ``cpu`` runs one of the two.
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


def spin(iterations: int) -> int:
    """A fixed amount of pure-Python work (it holds the GIL throughout)."""
    acc = 0
    for i in range(iterations):
        acc = (acc + i * i) % 1_000_003
    return acc


def iterations_for(seconds: float) -> int:
    """How many :func:`spin` iterations take about ``seconds`` here (measured once, best of three)."""
    n = 200_000
    best = min(_timed(n) for _ in range(3))
    return max(1, int(n * seconds / best))


def _timed(n: int) -> float:
    t0 = time.perf_counter()
    spin(n)
    return time.perf_counter() - t0


class SleepyCalculatorFactory:
    """Calculator tasks whose tool first sleeps ``tool_s`` seconds (``kind="sleep"``) or runs ``iterations`` of
    :func:`spin` (``kind="cpu"``), then computes."""

    name = "sleepy_calculator"

    def __init__(self, tool_s: float, n_tasks: int, kind: str = "sleep", iterations: int = 0) -> None:
        self._tasks, _ = generate_tasks(0, n_tasks, 1)

        def slow(expression: str) -> str:
            """Evaluate an arithmetic expression (slowly).

            Args:
                expression: Integer arithmetic, e.g. "347 * 28 + 1191".
            """
            if kind == "sleep":
                time.sleep(tool_s)
            else:
                spin(iterations)
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


def sweep(kind: str, args: argparse.Namespace, counts: list[int], tok: HarmonyTokenizer) -> dict[str, float | str]:
    """Episodes/s of ``kind``'s tool at each worker count and in-process; prints a table row each."""
    iterations = iterations_for(args.cpu_s) if kind == "cpu" else 0
    call_s = args.tool_s if kind == "sleep" else args.cpu_s
    recipe = functools.partial(SleepyCalculatorFactory, args.tool_s, args.episodes_per_worker * max(counts), kind,
                               iterations)  # fmt: skip
    local = recipe()
    cores = len(os.sched_getaffinity(0))
    print(f"\n{kind} tool: {call_s} s a call" + (f" ({iterations} loop iterations)" if iterations else ""))
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
        ideal = (n if kind == "sleep" else min(n, cores)) / call_s
        print(f"  ray workers={n}  episodes={len(tasks)}  episodes/s={rates[n]:6.2f}  efficiency={eff:.2f}  "
              f"of_ideal={rates[n] / ideal:.2f}  (pool start {started:.1f} s, load {os.getloadavg()[0]:.1f})",
              flush=True)  # fmt: skip
    tasks = local.tasks("train")[: max(counts) * args.episodes_per_worker]
    in_process = asyncio.run(episodes_per_s(local, tok, tasks, warmup=1))
    last = counts[-1]
    print(f"  in-process (no Ray)  episodes={len(tasks)}  episodes/s={in_process:6.2f}  "
          f"vs {last} workers {in_process / rates[last]:.2f}x")  # fmt: skip
    ideal_last = (last if kind == "sleep" else min(last, cores)) / call_s
    prefix = "" if kind == "sleep" else "cpu_"
    return {
        f"{prefix}episodes_per_s": ",".join(f"{rates[n]:.2f}" for n in counts),
        f"{prefix}efficiency_at_{last}": rates[last] / (last * rates[counts[0]] / counts[0]),
        f"{prefix}of_ideal_at_{last}": rates[last] / ideal_last,
        f"{prefix}in_process_eps": in_process,
        f"{prefix}in_process_vs_{last}": in_process / rates[last],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="1,2,4,8")
    ap.add_argument("--tool-s", type=float, default=0.5, help="seconds every sleep-bound tool call sleeps")
    ap.add_argument("--cpu-s", type=float, default=0.2, help="idle-machine seconds of one CPU-bound tool call")
    ap.add_argument("--tools", default="sleep,cpu", help="which tools: sleep, cpu or both")
    ap.add_argument("--episodes-per-worker", type=int, default=16)
    ap.add_argument("--cpus", type=int, default=2, help="logical CPUs of the local Ray cluster")
    ap.add_argument("--quick", action="store_true", help="1 and 2 workers, short tools, 2 episodes each: a smoke test")
    args = ap.parse_args()
    if args.quick:
        args.workers, args.tool_s, args.cpu_s, args.episodes_per_worker = "1,2", 0.05, 0.02, 2
    counts = [int(n) for n in args.workers.split(",")]
    kinds = [k for k in args.tools.split(",") if k]
    tok = HarmonyTokenizer.load_default()
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} cores)")
    ray = import_ray()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    t0 = time.perf_counter()
    ray.init(num_cpus=args.cpus, include_dashboard=False, logging_level="WARNING")
    print(f"local Ray cluster up in {time.perf_counter() - t0:.1f} s")
    figures: dict[str, float | str] = {}
    try:
        for kind in kinds:
            figures |= sweep(kind, args, counts, tok)
    finally:
        ray.shutdown()
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    cells = " ".join(f"{k}={v}" if isinstance(v, str) else f"{k}={v:.2f}" for k, v in figures.items())
    print(f"RESULT workers={','.join(map(str, counts))} {cells} cores={len(os.sched_getaffinity(0))}")


if __name__ == "__main__":
    main()
