"""A short run alone, beside a busy loop and beside a second identical run: what sharing the CPU costs.

Each run is ``harmonyrl train sft.steps=60 rl.steps=6 eval.n_tasks=16`` (change with ``--overrides``) as a
subprocess in a temporary output folder, timed from start to exit. "Beside a busy loop": a
``python -c 'while True: pass'`` runs throughout. "Beside a second run": two identical runs start together and
the first one's time is reported. A fair share of a 2-core machine costs 2x at most; the intra-op threads adapt
to the free cores (``harmonyrl/threads.py``, docs/contention.md). ``--compare`` also times a fixed all-cores team
(``adaptive_threads=false``) in the same session, the two alternating.
Every child is killed at the end, and each run has a timeout (``--timeout``; a run that hits it counts as the
timeout, marked ``>``).
Last line: ``RESULT alone_s=… beside_loop_s=… beside_run_s=… slowdown=…`` (the default, adaptive threads;
slowdown = the worse of beside_loop/alone and beside_run/alone).

Run: ``python benchmarks/contention.py [--compare] [--repeats N]``
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SITUATIONS = ("alone", "beside_loop", "beside_run")
VARIANTS = {"adaptive": "adaptive_threads=true", "fixed": "adaptive_threads=false"}


def start(
    cmd: list[str], env: dict[str, str], children: list[subprocess.Popen[bytes]], log: Path
) -> subprocess.Popen[bytes]:
    """A child in its own process group (so its whole tree can be killed), remembered for clean-up; its output
    goes to ``log`` (a pipe nobody reads could fill and stall it)."""
    with log.open("wb") as sink:
        proc = subprocess.Popen(cmd, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    children.append(proc)
    return proc


def kill(proc: subprocess.Popen[bytes]) -> None:
    """Kill ``proc``'s process group and reap it."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def train_cmd(out: Path, name: str, overrides: list[str]) -> list[str]:
    return [sys.executable, "-m", "harmonyrl.cli", "train", *overrides, f"output_dir={out}", f"run_name={name}"]


def wait_timed(proc: subprocess.Popen[bytes], started: float, timeout: float, log: Path) -> tuple[float, bool]:
    """Seconds from ``started`` until ``proc`` exits (True), or the timeout (False)."""
    try:
        proc.wait(timeout=max(0.0, started + timeout - time.perf_counter()))
    except subprocess.TimeoutExpired:
        return timeout, False
    if proc.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-1:]
        raise SystemExit(f"run failed (exit {proc.returncode}): {tail}")
    return time.perf_counter() - started, True


def time_run(situation: str, variant: str, args: argparse.Namespace, out: Path, tag: str) -> tuple[float, bool]:
    """One timed run of ``variant`` in ``situation``; every child it started is killed before it returns."""
    env = dict(os.environ)
    overrides = [*args.overrides, VARIANTS[variant]]
    children: list[subprocess.Popen[bytes]] = []
    try:
        if situation == "beside_loop":
            start([sys.executable, "-c", "while True: pass"], env, children, out / f"{tag}-loop.log")
        started, log = time.perf_counter(), out / f"{tag}-a.log"
        measured = start(train_cmd(out, f"{tag}-a", overrides), env, children, log)
        if situation == "beside_run":
            start(train_cmd(out, f"{tag}-b", overrides), env, children, out / f"{tag}-b.log")
        return wait_timed(measured, started, args.timeout, log)
    finally:
        for proc in children:
            kill(proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--compare", action="store_true", help="also time a fixed all-cores team (adaptive_threads=false)"
    )
    parser.add_argument("--repeats", type=int, default=1, help="rounds; medians are reported")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds before a run is killed")
    parser.add_argument("--overrides", type=shlex.split, default=shlex.split("sft.steps=60 rl.steps=6 eval.n_tasks=16"))
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the finally blocks kill the children
    variants = ["adaptive", "fixed"] if args.compare else ["adaptive"]
    times: dict[tuple[str, str], list[float]] = {}
    capped: set[tuple[str, str]] = set()
    with tempfile.TemporaryDirectory(prefix="hrl-contention-") as tmp:
        for r in range(args.repeats):
            for situation in SITUATIONS:
                for variant in variants:
                    seconds, done = time_run(situation, variant, args, Path(tmp), f"{r}-{situation}-{variant}")
                    times.setdefault((variant, situation), []).append(seconds)
                    if not done:
                        capped.add((variant, situation))
                    load = os.getloadavg()[0]
                    print(f"round {r} {variant:<9}{situation:<12}{seconds:8.1f} s  (load {load:.1f})", flush=True)
    med = {key: statistics.median(v) for key, v in times.items()}
    print(f"{'threads':<10}" + "".join(f"{s:>14}" for s in SITUATIONS) + f"{'slowdown':>10}")
    lines = []
    for variant in variants:
        a, loop, run = (med[(variant, s)] for s in SITUATIONS)
        mark = {s: ">" if (variant, s) in capped else "" for s in SITUATIONS}
        cells = "".join(f"{mark[s] + format(med[(variant, s)], '.1f'):>14}" for s in SITUATIONS)
        slowdown = max(loop, run) / a
        print(f"{variant:<10}{cells}{slowdown:>10.2f}")
        lines.append(f"alone_s={a:.1f} beside_loop_s={loop:.1f} beside_run_s={run:.1f} slowdown={slowdown:.2f}")
    print(f"load average at the end: {os.getloadavg()}")
    if args.compare:
        print(f"FIXED {lines[1]}")
    print(f"RESULT {lines[0]}")


if __name__ == "__main__":
    main()
