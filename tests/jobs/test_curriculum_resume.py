"""A run with a curriculum and dynamic sampling, killed mid-RL and resumed, draws the same tasks and ends with the
same metrics and episodes as an uninterrupted run: the task source's position is in every checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tiny_run import tiny_run

TINY = tiny_run(
    "rl.steps=4",
    "rollout.group_size=2",
    "eval.samples_per_task=1",
    "threads=1",
    "env.levels=[1,3]",
    "rl.curriculum.start_levels=1",
    "rl.curriculum.widen_every=1",
    "rl.sampling.filter_uniform_groups=true",
    "rl.sampling.max_extra_groups=2",
)
VOLATILE = ("time/", "rollout/tokens_per_s", "engine/")


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "harmonyrl.cli", *args]


def _rows(run: Path) -> list[dict[str, object]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rows]


@pytest.mark.slow  # two tiny runs and a resume: ~4 min on a loaded machine
def test_killed_and_resumed_curriculum_run_is_identical(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    subprocess.run(_cli("train", *TINY, f"output_dir={tmp_path}", "run_name=whole"), check=True, env=env,
                   capture_output=True)  # fmt: skip
    run = tmp_path / "cut"
    proc = subprocess.Popen(_cli("train", *TINY, f"output_dir={tmp_path}", "run_name=cut"), env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 120
    metrics = run / "metrics.jsonl"
    while time.monotonic() < deadline and (not metrics.is_file() or metrics.read_text().count('"phase": "rl"') < 2):
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (run / "summary.json").exists(), "the run finished before it could be killed"
    resumed = subprocess.run(_cli("train", "--resume", str(run)), env=env, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resuming after rl step" in resumed.stdout
    whole = _rows(tmp_path / "whole")
    assert _rows(run) == whole
    rl = [r for r in whole if r["phase"] == "rl"]
    assert [r["curriculum/open_buckets"] for r in rl] == [1.0, 2.0, 3.0, 3.0]  # widened by the schedule
    assert all("sampling/extra_groups" in r for r in rl)
    episodes = (run / "rollouts" / "episodes.jsonl").read_text()
    assert episodes == (tmp_path / "whole" / "rollouts" / "episodes.jsonl").read_text()
