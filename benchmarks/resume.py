"""Kill a training run with SIGKILL at random points, resume it each time, compare with an uninterrupted run.

    python benchmarks/resume.py [--kills 10] [--seed 0] [--max-staleness K] [key=value ...]

A small configuration (nano model, short SFT and RL) runs once uninterrupted. A second run of the same
configuration is killed with SIGKILL ``--kills`` times — each time at a random point of progress (after a
random number of completed SFT/RL steps, plus a random fraction of a second, so kills land inside SFT steps,
evaluations, rollouts and updates alike) — and resumed with ``harmonyrl train --resume`` after each kill,
until it finishes. ``lost_steps`` counts completed steps (SFT or RL rows in
metrics.jsonl) that a resume had to redo beyond the one in flight; ``identical`` compares metrics (timings
excluded) and recorded episodes byte for byte. SFT checkpoints every step here (``sft.checkpoint_every=1``;
RL always does), so no completed step is redone. Last line: ``RESULT kills=… lost_steps=… identical=…``.

``--max-staleness K`` (K > 0) runs the asynchronous pipeline (``rl.async.max_staleness=K``, docs/async.md): a
kill then also loses the batches collected ahead of the trainer, which the resumed run regenerates.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFIG = [
    "model.preset=nano",
    "sft.steps=60",
    "sft.batch_size=8",
    "sft.checkpoint_every=1",  # the default (50) would redo up to 49 SFT steps after a kill
    "rl.steps=12",
    "rollout.tasks_per_step=2",
    "rollout.group_size=4",
    "rollout.max_new_tokens=32",
    "eval.n_tasks=8",
    "eval.samples_per_task=2",
    "env.n_train=256",
    "env.n_test=16",
    "threads=1",
]
VOLATILE = ("time/", "rollout/tokens_per_s", "engine/")  # wall-clock and batching: depend on the machine


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "harmonyrl.cli", *args]


def _rows(run: Path) -> list[dict[str, object]]:
    path = run / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut by the kill
            break
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rows]


def _completed(run: Path) -> int:
    return sum(r["phase"] in ("sft", "rl") for r in _rows(run))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-staleness", type=int, default=0, help="async pipeline (docs/async.md); 0: sync")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="harmonyrl-resume-"))
    pipeline = [f"rl.async.max_staleness={args.max_staleness}", "rl.correction.weights.mode=truncate"]
    config = [*CONFIG, *(pipeline if args.max_staleness else []), *args.overrides, f"output_dir={out}"]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    start = time.perf_counter()
    subprocess.run(_cli("train", *config, "run_name=whole"), check=True, env=env, capture_output=True)
    duration = time.perf_counter() - start
    print(f"uninterrupted run: {duration:.1f} s")

    rng = random.Random(args.seed)
    total = _completed(out / "whole")
    # kill points: random progress marks (completed SFT/RL rows) in increasing order, each followed by a
    # random extra delay, so kills land inside SFT steps, evaluations, rollouts and updates alike
    marks = sorted(rng.sample(range(1, total), args.kills))
    run = out / "killed"
    kills, lost = 0, 0
    cmd = _cli("train", *config, "run_name=killed")
    for mark in marks:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while _completed(run) < mark and proc.poll() is None:
            time.sleep(0.005)
        time.sleep(rng.uniform(0.0, 0.3))
        if proc.poll() is not None:
            break
        before = _completed(run)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kills += 1
        resumed_from = _completed_after_rewind(run)
        lost += max(0, before - resumed_from - 1)  # the row of the step in flight may be redone
        print(f"kill {kills}: at {before}/{total} steps done, resumable at {resumed_from}")
        cmd = _cli("train", "--resume", str(run))
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    identical = _rows(run) == _rows(out / "whole")
    episodes = [(p / "rollouts" / "episodes.jsonl").read_bytes() for p in (run, out / "whole")]
    identical = identical and episodes[0] == episodes[1]
    print(f"RESULT kills={kills} lost_steps={lost} identical={str(identical).lower()}")


def _completed_after_rewind(run: Path) -> int:
    """Steps a resume will keep: the rows recorded in the last checkpoint's line count."""
    from harmonyrl.run.resume import load_progress

    saved = load_progress(run)  # read as data (weights_only), and as a resume reads it (``last.old`` included)
    if saved is None:
        return 0
    keep = saved.state.lines["metrics.jsonl"]
    rows = (run / "metrics.jsonl").read_text().splitlines()[:keep]
    return sum(json.loads(r)["phase"] in ("sft", "rl") for r in rows)


if __name__ == "__main__":
    main()
