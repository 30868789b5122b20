"""Kill a ``harmonyrl train`` process mid-RL with SIGKILL and resume it: what the resume tests share.

``killed_and_resumed(train_args, run)`` starts the run, kills it once ``metrics.jsonl`` holds ``after`` RL rows,
checks it had not finished, resumes it with ``harmonyrl train --resume`` and returns the resume's stdout; the test
then compares :func:`metric_rows` and the episodes with an uninterrupted run's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

VOLATILE = ("time/", "rollout/tokens_per_s", "engine/")
"""Metric keys that depend on the machine (wall clock, batching), left out of comparisons."""
ENV = {**os.environ, "PYTHONHASHSEED": "0"}


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "harmonyrl.cli", *args]


def metric_rows(run: Path) -> list[dict[str, object]]:
    """The run's metrics rows without the machine-dependent keys."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rows]


def killed_and_resumed(
    train_args: list[str], run: Path, after: int = 2, timeout_s: float = 600, env: dict[str, str] | None = None
) -> str:
    """``harmonyrl train *train_args`` (which must write to ``run``), SIGKILLed after ``after`` RL steps, then resumed;
    the resume's stdout (it says from which step). ``env``: the processes' environment (default :data:`ENV`)."""
    env = env or ENV
    proc = subprocess.Popen(cli("train", *train_args), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics, deadline = run / "metrics.jsonl", time.monotonic() + timeout_s
    while time.monotonic() < deadline and (not metrics.is_file() or metrics.read_text().count('"phase": "rl"') < after):
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (run / "summary.json").exists(), "the run finished before it could be killed"
    resumed = subprocess.run(cli("train", "--resume", str(run)), env=env, capture_output=True, text=True,
                             timeout=timeout_s)  # fmt: skip
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resuming after rl step" in resumed.stdout
    return resumed.stdout


def same_episodes(a: Path, b: Path) -> bool:
    return (a / "rollouts" / "episodes.jsonl").read_text() == (b / "rollouts" / "episodes.jsonl").read_text()
