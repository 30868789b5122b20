"""Minutes of RL to a held-out target, synchronous vs asynchronous (``rl.async.max_staleness`` 0, 1, 2), with a
slow, heavy-tailed tool, over several seeds.

    python benchmarks/async.py --warm SFT_CKPT [--seeds 0,1,2] [--steps 20] [--every 2] [key=value ...]

**Start.** A real warm start: the README default's SFT (``harmonyrl sft``, 500 × 16; held-out pass@1 ~30 % on the
calculator), given with ``--warm``, or made here (``--sft-steps``) when it is not.

**Runs.** For each seed, the same RL run from the warm start at each k, one after another in this process. The
order of the arms alternates with the seed (0,1,2 then 2,1,0, …): the machine's load drifts. During RL the
calculator tool sleeps a log-normal time before answering (median 0.5 s, sigma 1.2, the ``benchmarks/overlap.py``
distribution: a few calls over 5 s), drawn from a hash of its expression, so every run sees the same latency for
the same call; ``env.tool_timeout_s`` is raised so that no call times out. Evaluations run the tool without the
delay (they are off the clock anyway; it only shortens the benchmark). Async runs use decoupled PPO with
truncated token weights (``rl.correction.weights.mode=truncate``); the synchronous run is today's default.

**Clock and evaluations.** The runs evaluate only before RL and after the last step (``eval.every=0``): an
evaluation inside the run would make the pipeline drain first and so change what is measured. Instead the trainer's
weights are copied (in memory) after every ``--every`` steps and after the last, and evaluated on the held-out tasks
once the run has ended, off the clock (the final weights are evaluated both ways and must score the same). RL
seconds at step s: wall time from the end of the evaluation before RL to the end of step s's checkpoint; it counts
rollouts, updates and checkpoints, and nothing of the evaluations.

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
from typing import Any

import torch
from rich.console import Console

import harmonyrl.tasks.calculator as calculator_env
import harmonyrl.trainer.loop as loop
import harmonyrl.trainer.rl_phase as rl_phase
from harmonyrl.config import RunConfig, load_config
from harmonyrl.distributed.ray_envs import close_env_pool
from harmonyrl.harmony.codecs import load_codec
from harmonyrl.trainer.setup import load_for, make_engine, make_factory

MEDIAN_S, SIGMA = 0.5, 1.2
WARM_START = ["model.preset=micro", "threads=1"]
RL = [
    "model.preset=micro",
    "rollout.tasks_per_step=8",
    "rollout.group_size=8",
    "eval.n_tasks=128",
    "eval.samples_per_task=4",
    "env.tool_timeout_s=60",
    "threads=1",
]
ASYNC = ["rl.correction.weights.mode=truncate"]
EVALUATING = [False]
"""Set while a held-out evaluation runs: the tool answers without its delay (no batch is in flight then)."""
EVAL, SAVE = loop.held_out_eval, rl_phase.save_progress


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
class Clock:
    """One run's held-out evaluations (start, end, pass@1) and, per RL step, when it ended and (every
    ``every`` steps) a copy of the trainer's weights then."""

    every: int
    last: int
    evals: list[tuple[float, float, float]] = field(default_factory=list)
    steps: list[tuple[int, float, dict[str, torch.Tensor] | None]] = field(default_factory=list)


def clocked(clock: Clock) -> None:
    """Time the next run's evaluations (the tool's delay off during them) and the end of each of its RL steps."""
    made_eval, made_save = EVAL, SAVE

    def held_out_eval(*args: object) -> Callable[[], Awaitable[dict[str, float]]]:
        run = made_eval(*args)  # type: ignore[arg-type]

        async def timed() -> dict[str, float]:
            EVALUATING[0] = True
            t0 = time.perf_counter()
            try:
                metrics = await run()
            finally:
                EVALUATING[0] = False
            clock.evals.append((t0, time.perf_counter(), metrics["eval/success"]))
            return metrics

        return timed

    def save_progress(run_dir: Path, model: torch.nn.Module, phase: str, step: int, *args: Any, **kw: Any) -> None:
        made_save(run_dir, model, phase, step, *args, **kw)  # type: ignore[arg-type]
        if phase == "rl":
            keep = step % clock.every == 0 or step == clock.last
            state = {n: t.detach().clone() for n, t in model.state_dict().items()} if keep else None
            clock.steps.append((step, time.perf_counter(), state))

    loop.held_out_eval = held_out_eval  # type: ignore[assignment]
    rl_phase.save_progress = save_progress  # the RL step's save (trainer/rl_phase.py)


async def evaluate_states(cfg: RunConfig, start: Path, states: list[dict[str, torch.Tensor]]) -> list[float]:
    """Held-out pass@1 of each of ``states``: the run's own evaluation (same tasks, seed and decoding), the tool
    without its delay."""
    tok = load_codec(cfg.model.tokenizer)
    factory = make_factory(cfg)
    engine, limits = await make_engine(cfg, load_for(start, tok, cfg.rollout.max_seq_len), None)
    run = EVAL(cfg, engine, factory, tok, limits)
    out = []
    EVALUATING[0] = True
    try:
        for version, state in enumerate(states, start=1):
            await engine.sync_weights(state, version)
            out.append((await run())["eval/success"])
    finally:
        EVALUATING[0] = False
        await engine.close()
        close_env_pool(factory)
    return out


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
    """One RL run from the warm start at ``max_staleness=k``, then its weights' held-out curve."""
    changes = [f"rl.async.max_staleness={k}", *(ASYNC if k else [])]
    run = [f"seed={seed}", f"rl.steps={args.steps}", f"model.init_from={start}", f"output_dir={args.out}"]
    cfg = load_config(None, [*RL, *changes, *args.overrides, *run, f"run_name=s{seed}k{k}"])
    clock = Clock(args.every, args.steps)
    clocked(clock)
    load = f"{os.getloadavg()[0]:.1f}"
    result = asyncio.run(loop.train(cfg, console))
    load += f"→{os.getloadavg()[0]:.1f}"
    (_, rl_start, begin), *_, (_, _, final) = clock.evals
    kept = [(step, t, state) for step, t, state in clock.steps if state is not None]
    *scores, last = asyncio.run(evaluate_states(cfg, start, [state for _, _, state in kept]))
    if kept[-1][0] != args.steps or last != final:  # the offline evaluation is the run's own
        raise SystemExit(f"offline evaluation of the final weights {last} != the run's {final}")
    curve = [(0.0, begin)] + [(t - rl_start, p) for (_, t, _), p in zip(kept, scores, strict=False)]
    curve.append((clock.steps[-1][1] - rl_start, final))
    return Arm(k, seed, curve, *idle(result.run_dir), load)


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
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--every", type=int, default=2, help="evaluate the weights of every this many RL steps")
    parser.add_argument("--seeds", default="0,1,2")
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
