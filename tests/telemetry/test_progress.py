"""Progress without a terminal: plain, flushed lines with step/total, figures, elapsed and ETA."""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console

from harmonyrl.telemetry.progress import StepProgress, clock_text, progress_line


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _plain() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=False, width=60), out


def test_clock_text_and_line() -> None:
    assert clock_text(0) == "0:00:00" and clock_text(3725.4) == "1:02:05"
    # 3 steps in 12 s → 4 s a step; 7 left → 28 s
    assert progress_line("sft", 3, 10, 12.0, 3, "loss 0.5") == (
        "[sft] step 3/10 (30%)  loss 0.5  elapsed 0:00:12  eta 0:00:28"
    )
    assert progress_line("rl", 0, 4, 1.0, 0, "").endswith("eta ?")


def test_lines_at_most_every_n_seconds_and_at_phase_changes() -> None:
    console, out = _plain()
    clock = FakeClock()
    progress = StepProgress(console, every_s=10.0, clock=clock)
    progress.start("sft", 10)
    for step in range(1, 8):  # 4 s a step: due at 12 s (step 3) and 24 s (step 6); step 7 at the stop
        clock.now += 4.0
        progress.advance(f"loss {1 / step:.2f}")
    progress.stop()
    assert out.getvalue().splitlines() == [
        "[sft] started: 10 steps",
        "[sft] step 3/10 (30%)  loss 0.33  elapsed 0:00:12  eta 0:00:28",
        "[sft] step 6/10 (60%)  loss 0.17  elapsed 0:00:24  eta 0:00:16",
        "[sft] step 7/10 (70%)  loss 0.14  elapsed 0:00:28  eta 0:00:12",
    ]


def test_a_resumed_phase_estimates_from_its_own_pace() -> None:
    console, out = _plain()
    clock = FakeClock()
    progress = StepProgress(console, every_s=0.0, clock=clock)
    progress.start("rl", 60, done=50)
    clock.now += 5.0
    progress.advance("reward 0.50")
    progress.stop()  # step 51 was printed already: no repeat
    # one step in 5 s (not 51): 9 left → 45 s
    assert out.getvalue().splitlines() == [
        "[rl] resumed at step 50/60",
        "[rl] step 51/60 (85%)  reward 0.50  elapsed 0:00:05  eta 0:00:45",
    ]


def test_a_terminal_gets_the_live_bar_not_lines() -> None:
    out = io.StringIO()
    progress = StepProgress(Console(file=out, force_terminal=True, width=100), every_s=0.0)
    progress.start("sft", 2)
    progress.advance("loss 1.0")
    progress.stop()
    assert "[sft] step" not in out.getvalue() and "1/2" in out.getvalue()


def test_a_phase_without_steps_has_a_heartbeat() -> None:
    console, out = _plain()
    progress = StepProgress(console, every_s=0.5)  # heartbeat at least every 1 s
    assert asyncio.run(progress.during("eval", "held-out before RL", asyncio.sleep(1.4, result=7))) == 7
    lines = out.getvalue().splitlines()
    assert lines[0] == "[eval] held-out before RL: started"
    assert lines[1] == "[eval] held-out before RL: running  elapsed 0:00:01"
    assert lines[-1] == "[eval] held-out before RL: done  elapsed 0:00:01" and len(lines) == 3


def test_train_under_nohup_prints_progress_lines_as_it_goes(tmp_path: Path) -> None:
    """stdout is a file, as with ``nohup harmonyrl train > log``: the lines are in it while the run still runs."""
    tiny = [
        "model.preset=nano",
        "sft.steps=3",
        "sft.batch_size=4",
        "rl.steps=2",
        "rollout.tasks_per_step=2",
        "rollout.group_size=2",
        "rollout.max_new_tokens=24",
        "eval.n_tasks=4",
        "env.n_train=64",
        "env.n_test=8",
        "telemetry.progress_every_s=0",
    ]
    log = tmp_path / "log"
    with log.open("w") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "harmonyrl.cli", "train", *tiny, f"output_dir={tmp_path}", "run_name=r"],
            stdout=fh,
            stderr=subprocess.STDOUT,
            env={**os.environ, "COLUMNS": "200"},
        )
        deadline = time.monotonic() + 300
        while "[rl] started" not in log.read_text() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        still_running = proc.poll() is None
        assert proc.wait(timeout=300) == 0, log.read_text()
    text = log.read_text()
    assert still_running, "the progress lines only reached the log when the run ended"
    lines = text.splitlines()
    assert "[sft] started: 3 steps" in lines and "[rl] started: 2 steps" in lines
    for phase, total in (("sft", 3), ("rl", 2)):
        steps = [line for line in lines if line.startswith(f"[{phase}] step ")]
        assert [s.split()[2] for s in steps] == [f"{i}/{total}" for i in range(1, total + 1)], text
        assert all(" elapsed 0:0" in s and " eta " in s for s in steps), text
        assert steps[-1].endswith("eta 0:00:00")
    assert any(line.startswith("[sft] step 1/3 (33%)  loss ") for line in lines)
    assert any(line.startswith("[rl] step 2/2 (100%)  reward ") for line in lines)
    assert "[eval] held-out before RL: started" in lines and "[eval] held-out after RL: started" in lines


def test_a_runs_length_reads_in_seconds_minutes_or_hours() -> None:
    from harmonyrl.telemetry.progress import duration_text

    cases = [(0.0, "0 s"), (0.2, "12 s"), (0.99, "59 s"), (0.995, "1.0 min"), (3.44, "3.4 min"), (65.2, "1 h 05 min")]
    assert [duration_text(m) for m, _ in cases] == [text for _, text in cases]
