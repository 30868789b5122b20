"""``benchmarks/distill.py``: its smoke mode runs every arm end to end and ends with the RESULT line; the
figures it reports are computed from the curves as stated."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

from benchmark_module import BENCHMARKS, load_benchmark

distill = load_benchmark("distill")


def test_steps_to_a_target_is_the_first_evaluation_at_or_above_it() -> None:
    arm = distill.Arm([(0, 0.1), (4, 0.3), (8, 0.5), (12, 0.4)], [30.0, 30.0, 60.0])
    assert arm.steps_to(0.3) == 4 and arm.steps_to(0.45) == 8 and arm.steps_to(0.05) == 0
    assert math.isinf(arm.steps_to(0.6))
    assert arm.final == 0.4 and arm.minutes == 2.0


def test_a_periodic_evaluation_at_the_last_step_counts_once() -> None:
    assert distill._deduplicated([(0, 0.1), (4, 0.2), (4, 0.2), (2, 0.3)]) == [(0, 0.1), (2, 0.3), (4, 0.2)]


def test_the_smoke_mode_runs_every_arm_and_prints_the_result(tmp_path: Path) -> None:
    cmd = [sys.executable, str(BENCHMARKS / "distill.py"), "--quick", "--out", str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    result = done.stdout.strip().splitlines()[-1]
    assert result.startswith("RESULT ")
    keys = {kv.split("=", 1)[0] for kv in result.split()[1:]}
    for arm in ("teacher", "rl", "sft", "sft_all", "distill"):
        assert {arm, f"{arm}_se"} <= keys
    assert {"rl_min", "sft_min", "sft_all_min", "distill_min", "distill_vs_rl_pp", "distill_vs_sft_pp",
            "distill_vs_sft_all_pp", "seeds"} <= keys  # fmt: skip
    assert (tmp_path / "distill.json").is_file() and (tmp_path / "seed0" / "distill" / "metrics.jsonl").is_file()
    # a second invocation on the same --out keeps every arm's figures (seeds run apart are pooled by one run) ...
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout.count("kept from") == 4 and again.stdout.strip().splitlines()[-1] == result
    # ... and never figures made with other settings
    other = subprocess.run([*cmd, "--weight", "0.5"], capture_output=True, text=True, timeout=600, check=False)
    assert other.returncode != 0
    assert other.stderr.strip().splitlines()[-1].endswith("was made with other settings: use another --out, or "
                                                          "delete it to run it again")  # fmt: skip
