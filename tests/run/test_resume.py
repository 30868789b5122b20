"""A run killed with SIGKILL mid-RL and resumed ends with the same metrics and episodes as an uninterrupted run,
and its summary counts the killed process's time too."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from harmonyrl.run.checkpoint import STATE_FILE
from tiny_run import tiny_run

TINY = tiny_run(
    "sft.steps=12",
    "sft.checkpoint_every=5",
    "rl.steps=6",
    "rollout.group_size=4",
    "eval.samples_per_task=2",
    "threads=1",
)
VOLATILE = ("time/", "rollout/tokens_per_s", "engine/")  # wall-clock and batching: depend on the machine


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "harmonyrl.cli", *args]


def _stable_rows(run: Path) -> list[dict[str, object]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rows]


def _rl_rows(run: Path) -> int:
    path = run / "metrics.jsonl"
    return path.read_text().count('"phase": "rl"') if path.is_file() else 0


@pytest.mark.parametrize("kill_after_rl_rows", [0, 3])  # 0: killed during SFT / first eval; 3: mid-RL
def test_sigkill_then_resume_is_identical_to_an_uninterrupted_run(tmp_path: Path, kill_after_rl_rows: int) -> None:
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    subprocess.run(_cli("train", *TINY, f"output_dir={tmp_path}", "run_name=whole"), check=True, env=env,
                   capture_output=True)  # fmt: skip
    run = tmp_path / "cut"
    proc = subprocess.Popen(_cli("train", *TINY, f"output_dir={tmp_path}", "run_name=cut"), env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 120
    if kill_after_rl_rows == 0:  # somewhere after the first SFT checkpoint, before RL
        while not (run / "checkpoints" / "last").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
    else:
        while _rl_rows(run) < kill_after_rl_rows and time.monotonic() < deadline:
            time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (run / "summary.json").exists(), "the run finished before it could be killed"
    _add_an_hour_to_the_recorded_time(run / "checkpoints" / "last")
    resumed = subprocess.run(_cli("train", "--resume", str(run)), env=env, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    phase = "rl" if kill_after_rl_rows else "sft"
    assert f"resuming after {phase} step" in resumed.stdout  # it continued, it did not start over
    assert _stable_rows(run) == _stable_rows(tmp_path / "whole")
    episodes = (run / "rollouts" / "episodes.jsonl").read_text()
    assert episodes == (tmp_path / "whole" / "rollouts" / "episodes.jsonl").read_text()
    minutes = json.loads((run / "summary.json").read_text())["minutes"]
    assert 60 < minutes < 70  # the hour the killed process recorded, plus the resumed process's own minutes


def _add_an_hour_to_the_recorded_time(last: Path) -> None:
    """The killed process recorded the seconds it had spent; an hour more stands for a long first process, so the
    resumed run's ``summary.json`` must count it (a clock restarted by the resume would say a few seconds)."""
    state = torch.load(last / STATE_FILE, weights_only=True)
    assert state["elapsed_s"] > 0
    state["elapsed_s"] += 3600.0
    torch.save(state, last / STATE_FILE)


def test_resume_of_a_folder_that_is_not_a_run_is_a_one_line_error(tmp_path: Path) -> None:
    result = subprocess.run(_cli("train", "--resume", str(tmp_path)), capture_output=True, text=True)
    assert result.returncode == 2 and "not a run folder" in result.stdout and "Traceback" not in result.stderr
