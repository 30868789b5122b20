"""Minutes of RL to a held-out target, synchronous vs asynchronous (``rl.async.max_staleness`` 0, 1, 2), with a
slow, heavy-tailed tool, over several seeds.

    python benchmarks/async.py --warm SFT_CKPT [--seeds 0,1] [--steps 15] [--every 3] [key=value ...]

**Start.** A real warm start: the README default's SFT (``harmonyrl sft``, 500 × 16; held-out pass@1 ~30 % on the
calculator), given with ``--warm``, or made here (``--sft-steps``) when it is not.

**Runs.** For each seed, the same RL run from the warm start at each k, one after another in this process. The
order of the arms alternates with the seed (0,1,2 then 2,1,0, …): the machine's load drifts. During RL the
calculator tool sleeps a log-normal time before answering (median 0.5 s, sigma 1.2, the ``benchmarks/overlap.py``
distribution: a few calls over 5 s), drawn from a hash of its expression, so every run sees the same latency for
the same call; ``env.tool_timeout_s`` is raised so that no call times out. Evaluations run the tool without the
delay (their time is off the clock anyway; it only shortens the benchmark). Async runs use decoupled PPO with
truncated token weights (``rl.correction.weights.mode=truncate``); the synchronous run is today's default.

**Clock.** RL seconds: wall time from the end of the held-out evaluation before RL, minus every evaluation after it
(``eval.every`` steps and the final one). It counts rollouts, updates, checkpoints, and the pipeline's drain before
each evaluation (the batches running ahead finish then, on the clock).

**Target, chosen from the synchronous runs only.** ``target = start + (mean sync final − start) / 2``: midway
between the warm start's held-out pass@1 and the mean over seeds of the synchronous runs' final pass@1. An arm's
minutes to target: the RL minutes at which its held-out curve first reaches the target, interpolated linearly
between the two evaluations around the crossing; an arm that never reaches it counts as not reached (``inf``).

**Reported.** A table per seed and arm (RL minutes, minutes to target, final pass@1, idle fractions, load average
around the run), then ``RESULT sync_min=… async1_min=… async2_min=… speedup=… final_gap_pp=…``: ``*_min`` are the
minutes to target averaged over seeds; ``final_gap_pp`` = sync final − async final in points, averaged over seeds,
for the arm that ``speedup`` names; ``speedup`` = sync_min / the smallest async ``*_min`` among the arms whose
final_gap_pp ≤ 2 (if no arm keeps the gap ≤ 2: the fastest arm, and its gap, which then shows it).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import hashlib
import itertools
import json
import math
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

import harmonyrl.tasks.calculator as calculator_env
import harmonyrl.trainer.loop as loop
from harmonyrl.config import load_config

MEDIAN_S, SIGMA = 0.5, 1.2
WARM_START = ["model.preset=micro", "threads=1"]
RL = [
    "model.preset=micro",
    "rollout.tasks_per_step=8",
    "rollout.group_size=8",
    "eval.n_tasks=64",
    "eval.samples_per_task=4",
    "env.tool_timeout_s=60",
    "threads=1",
]
ASYNC = ["rl.correction.weights.mode=truncate"]
EVALUATING = [False]
"""Set while a held-out evaluation runs: the tool answers without its delay (no batch is in flight then)."""


def latency_s(expression: str) -> float:
    """The tool's delay for ``expression``: log-normal, a fixed function of the text."""
    u = int.from_bytes(hashlib.blake2b(expression.encode(), digest_size=8).digest(), "little") / 2**64
    z = statistics.NormalDist().inv_cdf(min(max(u, 1e-9), 1 - 1e-9))
    return MEDIAN_S * math.exp(SIGMA * z)


def slow_tool() -> None:
    """Make the calculator env's tool sleep :func:`latency_s` first (a sync tool: it runs off the event loop)."""
    exact = calculator_env.calculator

    @functools.wraps(exact)
    def calculator(expression: str) -> str:
        if not EVALUATING[0]:
            time.sleep(latency_s(expression))
        return exact(expression)

    calculator_env.calculator = calculator  # read when the env factory builds its toolbox


@dataclass
class Evals:
    """Each held-out evaluation of a run: when it started and ended, and its pass@1."""

    spans: list[tuple[float, float, float]] = field(default_factory=list)

    def curve(self) -> list[tuple[float, float]]:
        """(RL seconds, pass@1) at each evaluation: the first is the start (0 s)."""
        (_, end0, start), *rest = self.spans
        points, off = [(0.0, start)], 0.0
        for t0, t1, success in rest:
            points.append((t0 - end0 - off, success))
            off += t1 - t0
        return points


def timed_evals(evals: Evals) -> None:
    """Time every held-out evaluation of the next run and switch the tool's delay off during it."""
    made = loop.held_out_eval

    def held_out_eval(*args: object) -> Callable[[], Awaitable[dict[str, float]]]:
        run = made(*args)  # type: ignore[arg-type]

        async def timed() -> dict[str, float]:
            EVALUATING[0] = True
            t0 = time.perf_counter()
            try:
                metrics = await run()
            finally:
                EVALUATING[0] = False
            evals.spans.append((t0, time.perf_counter(), metrics["eval/success"]))
            return metrics

        return timed

    loop.held_out_eval = held_out_eval  # type: ignore[assignment]


def minutes_to(curve: list[tuple[float, float]], target: float) -> float:
    """RL minutes at which ``curve`` first reaches ``target``, interpolated linearly; ``inf`` if it never does."""
    if curve and curve[0][1] >= target:
        return 0.0
    for (s0, p0), (s1, p1) in itertools.pairwise(curve):
        if p1 >= target:
            return (s0 + (target - p0) / (p1 - p0) * (s1 - s0)) / 60
    return math.inf


@dataclass(frozen=True)
class Arm:
    """One RL run: its k and seed, its held-out curve and the figures around it."""

    k: int
    seed: int
    curve: list[tuple[float, float]]
    """(RL seconds, held-out pass@1) at each evaluation, from 0 s (the warm start)."""
    learner_idle: float
    engine_idle: float
    load: str

    @property
    def final(self) -> float:
        """Held-out pass@1 after the last step."""
        return self.curve[-1][1]


def idle(run: Path) -> tuple[float, float]:
    """Mean learner and engine idle fractions over the run's RL steps."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r["phase"] == "rl"]
    return (statistics.mean(r["time/learner_idle_frac"] for r in rl),
            statistics.mean(r["time/engine_idle_frac"] for r in rl))  # fmt: skip


def run_arm(k: int, seed: int, args: argparse.Namespace, start: Path, console: Console) -> Arm:
    """One RL run from the warm start at ``max_staleness=k``."""
    changes = [f"rl.async.max_staleness={k}", *(ASYNC if k else [])]
    cfg = load_config(None, [*RL, *changes, *args.overrides, f"seed={seed}", f"rl.steps={args.steps}",
                             f"eval.every={args.every}", f"model.init_from={start}", f"output_dir={args.out}",
                             f"run_name=s{seed}k{k}"])  # fmt: skip
    evals = Evals()
    timed_evals(evals)
    load = f"{os.getloadavg()[0]:.1f}"
    result = asyncio.run(loop.train(cfg, console))
    load += f"→{os.getloadavg()[0]:.1f}"
    return Arm(k, seed, evals.curve(), *idle(result.run_dir), load)


def summary(runs: list[Arm], ks: list[int]) -> str:
    """Print the table; return the RESULT line."""
    sync = [r for r in runs if r.k == 0]
    start = statistics.mean(r.curve[0][1] for r in runs)
    target = start + (statistics.mean(r.final for r in sync) - start) / 2
    print(f"start pass@1 {start:.1%}; target (midway to the sync runs' mean final) {target:.1%}")
    print(f"{'seed':>4} {'k':>2} {'RL min':>7} {'to target':>9} {'final':>6} {'learner idle':>12} {'engine idle':>11}  "
          f"{'load avg':>9}  curve (RL min: pass@1)")  # fmt: skip
    for r in runs:
        curve = " ".join(f"{s / 60:.1f}:{p:.0%}" for s, p in r.curve)
        print(f"{r.seed:>4} {r.k:>2} {r.curve[-1][0] / 60:7.2f} {minutes_to(r.curve, target):9.2f} {r.final:6.1%} "
              f"{r.learner_idle:12.2f} {r.engine_idle:11.2f}  {r.load:>9}  {curve}")  # fmt: skip
    per_k = {}
    for k in ks:
        mine = [r for r in runs if r.k == k]
        gaps = [s.final - r.final for s, r in zip(sync, mine, strict=True)]
        per_k[k] = (statistics.mean(minutes_to(r.curve, target) for r in mine), 100 * statistics.mean(gaps))
    sync_min = per_k[0][0]
    kept = [k for k in ks if k and per_k[k][1] <= 2.0] or [k for k in ks if k]
    best = min(kept, key=lambda k: per_k[k][0])
    line = f"RESULT sync_min={sync_min:.2f}" + "".join(f" async{k}_min={per_k[k][0]:.2f}" for k in ks if k)
    return line + f" speedup={sync_min / per_k[best][0]:.2f} final_gap_pp={per_k[best][1]:.1f} (k={best})"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--every", type=int, default=3, help="evaluate every this many RL steps")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--ks", default="0,1,2")
    parser.add_argument("--sft-steps", type=int, default=500)
    parser.add_argument("--out", type=Path, default=Path("runs/async-bench"))
    parser.add_argument("--warm", type=Path, default=None, help="reuse this warm start (an SFT checkpoint folder)")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    console = Console()
    ks = [int(x) for x in args.ks.split(",")]
    if ks[0] != 0:
        parser.error("--ks must start with 0: the target comes from the synchronous runs")
    sft = [*WARM_START, f"sft.steps={args.sft_steps}", f"output_dir={args.out}", "run_name=warm"]
    start = args.warm or asyncio.run(loop.sft_only(load_config(None, sft), console))
    slow_tool()
    runs: list[Arm] = []
    for i, seed in enumerate(int(x) for x in args.seeds.split(",")):
        for k in ks if i % 2 == 0 else ks[::-1]:
            runs.append(run_arm(k, seed, args, start, console))
            print(json.dumps(dataclasses.asdict(runs[-1])), flush=True)  # a partial benchmark is still readable
    runs.sort(key=lambda r: (r.seed, r.k))
    print(summary(runs, ks))


if __name__ == "__main__":
    main()
