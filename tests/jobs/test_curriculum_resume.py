"""A run with a curriculum and dynamic sampling, killed mid-RL and resumed, draws the same tasks and ends with the
same metrics and episodes as an uninterrupted run: the task source's position is in every checkpoint."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from kill_resume import ENV, cli, killed_and_resumed, metric_rows, same_episodes
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


@pytest.mark.slow  # two tiny runs and a resume: ~4 min on a loaded machine
def test_killed_and_resumed_curriculum_run_is_identical(tmp_path: Path) -> None:
    subprocess.run(cli("train", *TINY, f"output_dir={tmp_path}", "run_name=whole"), check=True, env=ENV,
                   capture_output=True)  # fmt: skip
    killed_and_resumed([*TINY, f"output_dir={tmp_path}", "run_name=cut"], tmp_path / "cut")
    whole = metric_rows(tmp_path / "whole")
    assert metric_rows(tmp_path / "cut") == whole
    assert same_episodes(tmp_path / "cut", tmp_path / "whole")
    rl = [r for r in whole if r["phase"] == "rl"]
    assert [r["curriculum/open_buckets"] for r in rl] == [1.0, 2.0, 3.0, 3.0]  # widened by the schedule
    assert all("sampling/extra_groups" in r for r in rl)
