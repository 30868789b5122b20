"""Minutes of RL to a held-out target, synchronous vs asynchronous (``rl.async.max_staleness`` 0, 1, 2), with a
slow, heavy-tailed tool, over several seeds, compute matched.

    python benchmarks/async.py --warm SFT_CKPT [--seeds 0,1,2] [--steps 20] [--every 2] [key=value ...]

**Compute matched.** Every arm runs ``threads=1``, but an async run's update runs in a worker thread beside the
event loop, so it keeps a second core busy. The synchronous run is therefore measured twice: at ``threads=1``
(``sync``, the earlier figure's baseline) and at ``threads=2`` (``sync2``: the same cores the async arms use; the
numerics are thread-count-invariant, so it learns the same curve, only its clock differs). Both speed-ups are reported;
the matched one (``speedup_matched``) is the fair one.

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
around the run), then ``RESULT sync_min=… sync2_min=… async1_min=… async2_min=… speedup=… speedup_se=…
speedup_matched=… speedup_matched_se=… final_gap_pp=… final_gap_se=… (k=…) seeds=…``: ``*_min`` are the minutes to
target averaged over seeds; ``final_gap_pp`` = sync final − async final in points, averaged over seeds, for the arm
that ``speedup`` names; ``speedup`` = sync_min / the smallest async ``*_min`` among the arms whose final_gap_pp ≤ 2
(if no arm keeps the gap ≤ 2: the fastest arm, and its gap, which then shows it); ``speedup_matched`` the same with
sync2_min. The ``_se`` figures are standard errors over seeds (:mod:`harmonyrl.telemetry.stats`): of the per-seed
speed-up (arms paired by seed) and of the per-seed gap. All seeds run in one invocation (``--seeds 0,1,2,3,4``):
nothing is pooled by hand. ``--quick``: one seed, a tiny model, 2 RL steps and a short tool delay (a smoke test).

**Partial rollouts** (``--partial 1,2``, the default; ``--partial ''`` leaves them out): the async arms again with
``rl.async.partial=true`` (docs/async.md), labelled ``partial<k>``. They are not candidates for ``speedup``
(which keeps its meaning); the RESULT line has ``partial<k>_min`` beside the others and appends ``partial<k>_gap_pp``
(sync final − its final, points, mean over seeds) and ``partial<k>_vs_async<k>`` (async<k>'s minutes to target /
its own). Every arm also reports the length distribution the issue asks about: the turns per episode of every
sampled episode (``rollouts/episodes.jsonl``) and of the trained ones (``rollouts/step_*.parquet``, what the
update read), their means, and the share of trained episodes sampled by more than one version.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import hashlib
import json
import math
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from rich.console import Console

import harmonyrl.jobs.train as loop
import harmonyrl.tasks.calculator as calculator_env
from harmonyrl.config import RunConfig, load_config
from harmonyrl.distributed.ray_envs import close_env_pool
from harmonyrl.harmony.codecs import load_codec
from harmonyrl.rollout.store import list_steps, read_step, step_path
from harmonyrl.run.hooks import RunHooks
from harmonyrl.run.setup import load_for, make_engine, make_factory
from harmonyrl.telemetry.stats import over_seeds, time_to_target

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
QUICK = ["model.preset=nano", "rollout.tasks_per_step=2", "rollout.group_size=2", "eval.n_tasks=4",
         "eval.samples_per_task=2"]  # fmt: skip
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
class Clock:
    """One run's held-out evaluations (start, end, pass@1) and, per RL step, when it ended and (every
    ``every`` steps) a copy of the trainer's weights then."""

    every: int
    last: int
    evals: list[tuple[float, float, float]] = field(default_factory=list)
    steps: list[tuple[int, float, dict[str, torch.Tensor] | None]] = field(default_factory=list)


def clocked(clock: Clock) -> RunHooks:
    """Hooks that time the run's evaluations (the tool's delay off during them) and the end of each RL step."""
    started: list[float] = []

    @contextmanager
    def on_eval() -> Iterator[None]:
        EVALUATING[0] = True
        started.append(time.perf_counter())
        try:
            yield
        finally:
            EVALUATING[0] = False
            started.append(time.perf_counter())

    def on_eval_done(metrics: dict[str, float]) -> None:
        t1, t0 = started.pop(), started.pop()
        clock.evals.append((t0, t1, metrics["eval/success"]))

    def on_step(step: int, model: torch.nn.Module) -> None:
        keep = step % clock.every == 0 or step == clock.last
        state = {n: t.detach().clone() for n, t in model.state_dict().items()} if keep else None
        clock.steps.append((step, time.perf_counter(), state))

    return RunHooks(on_eval, on_eval_done, on_step)


async def evaluate_states(cfg: RunConfig, start: Path, states: list[dict[str, torch.Tensor]]) -> list[float]:
    """Held-out pass@1 of each of ``states``: the run's own evaluation (same tasks, seed and decoding), the tool
    without its delay."""
    tok = load_codec(cfg.model.tokenizer)
    factory = make_factory(cfg)
    engine, limits = await make_engine(cfg, load_for(start, tok, cfg.rollout.max_seq_len), None)
    run = loop.held_out_eval(cfg, engine, factory, tok, limits)
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
    return time_to_target(curve, target) / 60


@dataclass(frozen=True)
class Arm:
    """One RL run: its k and seed, its held-out curve and the figures around it."""

    k: int
    seed: int
    threads: int
    curve: list[tuple[float, float]]
    """(RL seconds, held-out pass@1) at each evaluation, from 0 s (the warm start)."""
    learner_idle: float
    engine_idle: float
    load: str
    partial: bool = False
    sampled_turns: dict[int, int] = field(default_factory=dict)
    """Turns per episode → episodes, over every episode the run sampled."""
    trained_turns: dict[int, int] = field(default_factory=dict)
    """The same over the episodes the updates trained on."""
    spanning: float = 0.0
    """Share of the trained episodes sampled by more than one policy version."""

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


def lengths(run: Path) -> tuple[dict[int, int], dict[int, int], float]:
    """Turns per episode → count, over the sampled episodes and over the trained ones; the share of trained
    episodes that more than one version sampled."""
    sampled: dict[int, int] = {}
    for line in (run / "rollouts" / "episodes.jsonl").read_text().splitlines():
        n = len(json.loads(line)["turns"])
        sampled[n] = sampled.get(n, 0) + 1
    trained: dict[int, int] = {}
    spanning = total = 0
    for step in list_steps(run):
        for traj in read_step(step_path(run, step)):
            trained[len(traj.turns)] = trained.get(len(traj.turns), 0) + 1
            spanning += bool(traj.token_versions)
            total += 1
    return dict(sorted(sampled.items())), dict(sorted(trained.items())), spanning / max(total, 1)


def mean_of(histogram: dict[int, int]) -> float:
    """The mean of a value → count histogram."""
    return sum(v * n for v, n in histogram.items()) / max(sum(histogram.values()), 1)


def run_arm(
    k: int, threads: int, seed: int, args: argparse.Namespace, start: Path, console: Console, partial: bool = False
) -> Arm:
    """One RL run from the warm start at ``max_staleness=k`` on ``threads`` (``partial``: with partial rollouts),
    then its weights' held-out curve."""
    changes = [f"rl.async.max_staleness={k}", *(ASYNC if k else []), f"threads={threads}"]
    changes += ["rl.async.partial=true"] if partial else []
    run = [f"seed={seed}", f"rl.steps={args.steps}", f"model.init_from={start}", f"output_dir={args.out}"]
    name = f"s{seed}k{k}t{threads}" + ("p" if partial else "")
    cfg = load_config(None, [*RL, *args.overrides, *changes, *run, f"run_name={name}"])
    clock = Clock(args.every, args.steps)
    load = f"{os.getloadavg()[0]:.1f}"
    result = asyncio.run(loop.train(cfg, console, hooks=clocked(clock)))
    load += f"→{os.getloadavg()[0]:.1f}"
    (_, rl_start, begin), *_, (_, _, final) = clock.evals
    kept = [(step, t, state) for step, t, state in clock.steps if state is not None]
    *scores, last = asyncio.run(evaluate_states(cfg, start, [state for _, _, state in kept]))
    if kept[-1][0] != args.steps or last != final:  # the offline evaluation is the run's own
        raise SystemExit(f"offline evaluation of the final weights {last} != the run's {final}")
    curve = [(0.0, begin)] + [(t - rl_start, p) for (_, t, _), p in zip(kept, scores, strict=False)]
    curve.append((clock.steps[-1][1] - rl_start, final))
    return Arm(k, seed, threads, curve, *idle(result.run_dir), load, partial, *lengths(result.run_dir))


def label(arm: Arm) -> str:
    """``sync``, ``sync2`` (the synchronous run on two threads), ``async<k>`` or ``partial<k>``."""
    if arm.partial:
        return f"partial{arm.k}"
    return f"async{arm.k}" if arm.k else ("sync" if arm.threads == 1 else f"sync{arm.threads}")


def summary(runs: list[Arm]) -> str:
    """Print the table; return the RESULT line."""
    sync = {r.seed: r for r in runs if label(r) == "sync"}
    start = statistics.mean(r.curve[0][1] for r in runs)
    target = start + (statistics.mean(r.final for r in sync.values()) - start) / 2
    print(f"start pass@1 {start:.1%}; target (midway to the sync runs' mean final) {target:.1%}")
    print(f"{'seed':>4} {'arm':>6} {'RL min':>7} {'to target':>9} {'final':>6} {'learner idle':>12} "
          f"{'engine idle':>11}  {'load avg':>9}  curve (RL min: pass@1)")  # fmt: skip
    for r in runs:
        curve = " ".join(f"{s / 60:.1f}:{p:.0%}" for s, p in r.curve)
        print(f"{r.seed:>4} {label(r):>8} {r.curve[-1][0] / 60:7.2f} {minutes_to(r.curve, target):9.2f} "
              f"{r.final:6.1%} {r.learner_idle:12.2f} {r.engine_idle:11.2f}  {r.load:>9}  {curve}")  # fmt: skip
    print("turns per episode, sampled vs trained (turns: episodes), and trained episodes spanning versions")
    for r in runs:
        print(f"{r.seed:>4} {label(r):>8} sampled mean {mean_of(r.sampled_turns):.2f} {r.sampled_turns}  trained "
              f"mean {mean_of(r.trained_turns):.2f} {r.trained_turns}  spanning {r.spanning:.0%}")  # fmt: skip
    names = list(dict.fromkeys(label(r) for r in runs))
    minutes = {n: {r.seed: minutes_to(r.curve, target) for r in runs if label(r) == n} for n in names}
    gaps = {n: {r.seed: 100 * (sync[r.seed].final - r.final) for r in runs if label(r) == n} for n in names}
    mean_min = {n: statistics.mean(minutes[n].values()) for n in names}
    asyncs = [n for n in names if n.startswith("async")]
    partials = [n for n in names if n.startswith("partial")]
    kept = [n for n in asyncs if statistics.mean(gaps[n].values()) <= 2.0] or asyncs
    best = min(kept, key=lambda n: mean_min[n])
    seeds = sorted(sync)

    def ratio(base: str) -> tuple[float, float]:
        """``base`` minutes / ``best`` minutes: the ratio of the means, and the SE of the per-seed ratios."""
        per_seed = {s: minutes[base][s] / minutes[best][s] for s in seeds if 0 < minutes[best][s] < math.inf}
        se = over_seeds(per_seed).se if len(per_seed) > 1 else math.nan
        return (mean_min[base] / mean_min[best] if 0 < mean_min[best] < math.inf else math.nan), se

    speedup, speedup_se = ratio("sync")
    line = "RESULT " + " ".join(f"{n}_min={mean_min[n]:.2f}" for n in names)
    line += f" speedup={speedup:.2f} speedup_se={speedup_se:.2f}"
    if "sync2" in names:
        matched, matched_se = ratio("sync2")
        line += f" speedup_matched={matched:.2f} speedup_matched_se={matched_se:.2f}"
    gap = over_seeds(gaps[best]) if len(seeds) > 1 else None
    gap_mean = statistics.mean(gaps[best].values())
    line += (f" final_gap_pp={gap_mean:.1f} final_gap_se={gap.se if gap else math.nan:.1f} "
             f"(k={best.removeprefix('async')}) seeds={','.join(map(str, seeds))}")  # fmt: skip
    for n in partials:  # after the headline keys, which keep their meaning
        twin = "async" + n.removeprefix("partial")
        vs = mean_min[twin] / mean_min[n] if twin in mean_min and 0 < mean_min[n] < math.inf else math.nan
        line += f" {n}_gap_pp={statistics.mean(gaps[n].values()):.1f} {n}_vs_{twin}={vs:.2f}"  # {n}_min: above
    return line


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--every", type=int, default=2, help="evaluate the weights of every this many RL steps")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--ks", default="0,1,2", help="staleness of the arms; 0 is the synchronous run")
    parser.add_argument("--no-matched", action="store_true", help="leave out sync2, the sync run on two threads")
    parser.add_argument("--partial", default="1,2", help="the async arms to run again with rl.async.partial=true")
    parser.add_argument("--quick", action="store_true", help="one seed, tiny model, 2 RL steps: a smoke test")
    parser.add_argument("--sft-steps", type=int, default=500)
    parser.add_argument("--out", type=Path, default=Path("runs/async-bench"))
    parser.add_argument("--warm", type=Path, default=None, help="reuse this warm start (an SFT checkpoint folder)")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    global MEDIAN_S
    if args.quick:
        args.seeds, args.steps, args.every, args.sft_steps, MEDIAN_S = "0", 2, 1, 4, 0.01
        args.overrides = [*QUICK, *args.overrides]
        if args.out == Path("runs/async-bench"):  # a smoke test never collides with an earlier run's folders
            args.out = Path(tempfile.mkdtemp(prefix="harmonyrl-async-"))
    console = Console()
    ks = [int(x) for x in args.ks.split(",")]
    if ks[0] != 0:
        parser.error("--ks must start with 0: the target comes from the synchronous runs")
    partial = [int(x) for x in args.partial.split(",") if x]
    if any(k < 1 for k in partial):
        parser.error("--partial takes staleness bounds >= 1: partial rollouts continue episodes across updates")
    arms = [(0, 1, False), *([] if args.no_matched else [(0, 2, False)]), *((k, 1, False) for k in ks if k)]
    arms += [(k, 1, True) for k in partial]
    sft = [*WARM_START, *(QUICK if args.quick else []), f"sft.steps={args.sft_steps}", f"output_dir={args.out}",
           "run_name=warm"]  # fmt: skip
    start = args.warm or asyncio.run(loop.sft_only(load_config(None, sft), console))
    slow_tool()
    runs: list[Arm] = []
    for i, seed in enumerate(int(x) for x in args.seeds.split(",")):
        for k, threads, partial_arm in arms if i % 2 == 0 else arms[::-1]:
            runs.append(run_arm(k, threads, seed, args, start, console, partial_arm))
            print(json.dumps(dataclasses.asdict(runs[-1])), flush=True)  # a partial benchmark is still readable
    runs.sort(key=lambda r: (r.seed, r.partial, r.k, r.threads))
    print(summary(runs))


if __name__ == "__main__":
    main()
