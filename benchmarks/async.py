"""Synchronous vs asynchronous RL (``rl.async.max_staleness`` 0, 1, 2) with a slow, heavy-tailed tool.

    python benchmarks/async.py [--steps 20] [--sft-steps 300] [--ks 0,1,2] [--warm SFT_CKPT] [key=value ...]

One warm start (``harmonyrl sft``, or ``--warm``), then the same RL run from it at each ``max_staleness``, one
after the other in this process, in the order ``--ks`` gives (reverse it in a second invocation: the machine's
load drifts). The calculator tool sleeps a log-normal time before answering (median 0.5 s, sigma 1.2,
the ``benchmarks/overlap.py`` distribution: a few calls over 5 s), drawn from a hash of its expression, so every
run sees the same latency for the same call; ``env.tool_timeout_s`` is raised so that no call times out.
Async runs use decoupled PPO with truncated token weights (``rl.correction.weights.mode=truncate``); the
synchronous run is today's default.

Reported per run: RL seconds (the sum of ``time/step_s``: rollouts and updates, without the held-out
evaluations), held-out pass@1 after RL (the same 1-in-4 evaluation for all), the mean idle fractions and the
load average around the run (the machine is shared: compare the rows of one invocation, not across invocations).
Last line: ``RESULT sync_s=… async_s=… speedup=… success_sync=… success_async=…`` (async: k = 1), then the
k = 2 figures.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import hashlib
import json
import math
import os
import statistics
import tempfile
import time
from pathlib import Path

from rich.console import Console

import harmonyrl.tasks.calculator as calculator_env
from harmonyrl.config import load_config
from harmonyrl.trainer.loop import sft_only, train

MEDIAN_S, SIGMA = 0.5, 1.2
WARM_START = ["model.preset=micro", "threads=1"]
RL = [
    "model.preset=micro",
    "rollout.tasks_per_step=4",
    "rollout.group_size=8",
    "eval.n_tasks=64",
    "eval.samples_per_task=4",
    "env.tool_timeout_s=60",
    "threads=1",
]
ASYNC = ["rl.correction.weights.mode=truncate"]


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
        time.sleep(latency_s(expression))
        return exact(expression)

    calculator_env.calculator = calculator  # read when the env factory builds its toolbox


def _rl_figures(run: Path) -> dict[str, float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r["phase"] == "rl"]
    return {
        "rl_s": sum(r["time/step_s"] for r in rl),
        "learner_idle": statistics.mean(r.get("time/learner_idle_frac", float("nan")) for r in rl),
        "engine_idle": statistics.mean(r.get("time/engine_idle_frac", float("nan")) for r in rl),
        "staleness": statistics.mean(r.get("async/staleness_mean", float("nan")) for r in rl),
        "dropped": sum(r.get("async/dropped", 0.0) for r in rl),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--ks", default="0,1,2")
    parser.add_argument("--sft-steps", type=int, default=300)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--warm", type=Path, default=None, help="reuse this warm start (an SFT checkpoint folder)")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    console = Console()
    out = args.out or Path(tempfile.mkdtemp(prefix="harmonyrl-async-"))
    sft = [*WARM_START, *args.overrides, f"sft.steps={args.sft_steps}"]
    warm = load_config(None, [*sft, f"output_dir={out}", "run_name=warm"])
    start = args.warm or asyncio.run(sft_only(warm, console))
    slow_tool()
    results: dict[int, tuple[float, dict[str, float], str]] = {}
    for k in (int(x) for x in args.ks.split(",")):
        changes = [f"rl.async.max_staleness={k}", *(ASYNC if k else [])]
        cfg = load_config(None, [*RL, *changes, *args.overrides, f"rl.steps={args.steps}", f"model.init_from={start}",
                                 f"output_dir={out}", f"run_name=k{k}"])  # fmt: skip
        load = f"{os.getloadavg()[0]:.1f}"
        result = asyncio.run(train(cfg, console))
        load += f"→{os.getloadavg()[0]:.1f}"
        results[k] = (result.success_after, _rl_figures(result.run_dir), load)
    print(f"{'k':>2} {'RL s':>8} {'pass@1':>7} {'learner idle':>12} {'engine idle':>11} {'staleness':>9} "
          f"{'dropped':>7}  load avg")  # fmt: skip
    for k, (success, f, load) in results.items():
        print(f"{k:>2} {f['rl_s']:8.1f} {success:7.1%} {f['learner_idle']:12.2f} {f['engine_idle']:11.2f} "
              f"{f['staleness']:9.2f} {f['dropped']:7.0f}  {load}")  # fmt: skip
    sync, one = results.get(0), results.get(1)
    if sync is None or one is None:
        return
    sync_s, one_s = sync[1]["rl_s"], one[1]["rl_s"]
    line = f"RESULT sync_s={sync_s:.1f} async_s={one_s:.1f} speedup={sync_s / one_s:.2f} "
    line += f"success_sync={sync[0]:.3f} success_async={one[0]:.3f}"
    if 2 in results:
        two_s = results[2][1]["rl_s"]
        line += f" async2_s={two_s:.1f} speedup2={sync_s / two_s:.2f} success_async2={results[2][0]:.3f}"
    print(line)


if __name__ == "__main__":
    main()
