"""One trial of a sweep: a ``harmonyrl train -c TRIAL.yaml`` subprocess, watched through its ``metrics.jsonl``.

While it runs, each periodic held-out evaluation (``eval.every``: the ``eval/success`` of an RL step's row) is
reported to the pruner; when the pruner says stop, the process is ended and the trial is pruned. The objective is
the held-out pass@1 after RL (``summary.json``'s ``success_after``). A process that exits non-zero is a failed
trial carrying the run's own one-line error; it never stops the sweep.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from harmonyrl.sweep.space import Scalar

TrialState = Literal["complete", "pruned", "failed"]

Reporter = Callable[[int, float], bool]
"""``report(rl_step, held_out_pass_at_1)`` → True when the pruner says the trial should stop now."""


@dataclass(frozen=True)
class TrialJob:
    """What a runner needs to run one trial."""

    number: int
    params: dict[str, Scalar]
    config_path: Path
    """The trial's whole config, as ``harmonyrl train -c`` reads it."""
    run_dir: Path
    """The run folder ``train`` writes (``output_dir/run_name`` of the config)."""
    log_path: Path
    """The subprocess's console output."""


@dataclass(frozen=True)
class TrialOutcome:
    """How a trial ended: its objective (the last intermediate value when pruned), wall time, and why it failed."""

    state: TrialState
    value: float | None
    minutes: float
    error: str | None = None


TrialRunner = Callable[[TrialJob, Reporter, threading.Event], TrialOutcome]
"""Runs one trial to its end, or until the event is set (the sweep is stopping); never raises for a failure of the
trial itself (the sweep records it)."""


@dataclass
class MetricsTail:
    """Reads the held-out evaluations an RL run appends to ``metrics.jsonl``, each once, as they are written."""

    path: Path
    _offset: int = field(default=0, init=False)

    def new_evals(self) -> list[tuple[int, float]]:
        """``(rl_step, eval/success)`` of the periodic evaluations written since the last call (whole lines only)."""
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        end = chunk.rfind(b"\n") + 1  # a line being written is read next time
        self._offset += end
        found = []
        for line in chunk[:end].splitlines():
            row = json.loads(line)
            if row.get("phase") == "rl" and "eval/success" in row:
                found.append((int(row["step"]), float(row["eval/success"])))
        return found


def train_command(job: TrialJob) -> list[str]:
    """The trial's process: this Python running the console script's module (so a ``PYTHONPATH`` carries over)."""
    return [sys.executable, "-m", "harmonyrl.cli", "train", "-c", str(job.config_path)]


def run_train_process(job: TrialJob, report: Reporter, stop: threading.Event, poll_s: float = 1.0) -> TrialOutcome:
    """Run ``harmonyrl train`` for ``job``, reporting each periodic held-out evaluation; see the module doc."""
    t0 = time.monotonic()
    tail = MetricsTail(job.run_dir / "metrics.jsonl")
    last: float | None = None
    job.log_path.parent.mkdir(parents=True, exist_ok=True)
    with job.log_path.open("w", encoding="utf-8") as log:
        proc = subprocess.Popen(train_command(job), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            while proc.poll() is None:
                if stop.wait(poll_s):
                    return TrialOutcome("failed", last, (time.monotonic() - t0) / 60, "interrupted: the sweep stopped")
                for step, value in tail.new_evals():
                    last = value
                    if report(step, value):
                        return TrialOutcome("pruned", value, (time.monotonic() - t0) / 60)
        finally:
            _end(proc)
    minutes = (time.monotonic() - t0) / 60
    if proc.returncode != 0:
        return TrialOutcome("failed", last, minutes, error_line(job.log_path, proc.returncode))
    try:
        summary = json.loads((job.run_dir / "summary.json").read_text())
        return TrialOutcome("complete", float(summary["success_after"]), minutes)
    except (OSError, ValueError, KeyError) as e:
        return TrialOutcome("failed", last, minutes, f"the run ended without a usable summary.json ({e})")


def _end(proc: subprocess.Popen[bytes], grace_s: float = 10.0) -> None:
    """Stop a trial's process if it still runs: SIGTERM, then SIGKILL after ``grace_s``."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def error_line(log_path: Path, returncode: int) -> str:
    """The one-line reason a trial's run failed: its last ``error:`` line, else its last line, else the exit code."""
    try:
        lines = [ln.strip() for ln in log_path.read_text(encoding="utf-8", errors="replace").splitlines()]
    except OSError:
        lines = []
    lines = [ln for ln in lines if ln]
    errors = [ln for ln in lines if ln.startswith("error:")]
    text = errors[-1].removeprefix("error:").strip() if errors else (lines[-1] if lines else "")
    text = text if len(text) <= 300 else text[:297] + "..."
    return f"{text} (exit {returncode}, log {log_path})" if text else f"exit {returncode} (log {log_path})"
