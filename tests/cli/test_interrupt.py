"""Ctrl-C (SIGINT) ends a run with one line saying where it got to and how to continue it; ``--resume`` then
finishes the run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from harmonyrl.run.folder import completed, interrupted_message
from tiny_run import tiny_run

RL_STEPS = 40


def _rl_rows(run: Path) -> list[int]:
    metrics = run / "metrics.jsonl"
    if not metrics.is_file():
        return []
    rows = []
    for line in metrics.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:  # a line being written
            continue
        if row.get("phase") == "rl":
            rows.append(row["step"])
    return rows


def _default_sigint() -> None:
    """In the child before it starts: SIGINT's default action, whatever the test runner inherited. A shell without
    job control starts background commands with SIGINT ignored (``cmd &``: SigIgn has bit 2), a child inherits
    that, and Python then leaves Ctrl-C ignored, so the run would not be interrupted at all."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _harmonyrl(*args: str, out: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    with out.open("w") as f:
        return subprocess.Popen(
            [sys.executable, "-m", "harmonyrl.cli", *args],
            stdout=f,
            stderr=subprocess.STDOUT,
            env=env,
            preexec_fn=_default_sigint,
        )


def test_sigint_says_where_the_run_stopped_and_resume_finishes_it(tmp_path: Path) -> None:
    run = tmp_path / "r"
    config = tiny_run(f"rl.steps={RL_STEPS}", "rl.skip_zero_variance_groups=false", "rl.entropy_coef=0.01")
    first = _harmonyrl("train", *config, f"output_dir={tmp_path}", "run_name=r", out=tmp_path / "first.txt")
    deadline = time.monotonic() + 300
    while not any(step >= 2 for step in _rl_rows(run)):
        assert first.poll() is None and time.monotonic() < deadline, (tmp_path / "first.txt").read_text()
        time.sleep(0.05)
    first.send_signal(signal.SIGINT)
    assert first.wait(timeout=120) == 130
    said = (tmp_path / "first.txt").read_text().splitlines()
    done = completed(run)
    assert done is not None and done[0] == "RL" and 2 <= done[1] < RL_STEPS, said
    assert said[-1] == f"interrupted after RL step {done[1]}; resume with: harmonyrl train --resume {run}"
    assert "Traceback" not in "\n".join(said)

    second = _harmonyrl("train", "--resume", str(run), out=tmp_path / "second.txt")
    assert second.wait(timeout=600) == 0, (tmp_path / "second.txt").read_text()
    assert _rl_rows(run) == list(range(1, RL_STEPS + 1))  # every step once: none lost, none repeated
    assert (run / "summary.json").is_file() and (run / "checkpoints" / "final" / "model.safetensors").is_file()


def test_the_message_before_any_step_and_after_sft(tmp_path: Path) -> None:
    assert interrupted_message(tmp_path / "gone", "train") == (
        "interrupted before the first step: nothing to resume (the run folder was removed)"
    )
    run = tmp_path / "r"
    run.mkdir()
    (run / "metrics.jsonl").write_text(
        '{"step": 0, "phase": "sft"}\n{"step": 1, "phase": "sft"}\n{"step": 0, "phase": "eval"}\n{"step": 2, "ph'
    )
    assert completed(run) == ("SFT", 2)  # two SFT steps done (rows count from 0); the cut line is skipped
    assert interrupted_message(run, "sft") == f"interrupted after SFT step 2; resume with: harmonyrl sft --resume {run}"
