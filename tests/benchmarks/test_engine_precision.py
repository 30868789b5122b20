"""``benchmarks/engine_precision.py`` at one layer of gpt-oss-20b's geometry: its fp32 arm is the claim docs/gpu.md
leans on (the engine computes the trainer's function: what remains in bf16 is bf16's own), so the test holds the
script to it, and to its RESULT line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_fp32_engine_matches_the_fp32_trainer_at_20b_geometry() -> None:
    cmd = [sys.executable, str(ROOT / "benchmarks" / "engine_precision.py"), "--layers", "1", "--prompts", "2",
           "--new", "4"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    result = done.stdout.strip().splitlines()[-1]
    assert result.startswith("RESULT ")
    figures = dict(kv.split("=", 1) for kv in result.split()[1:])
    assert abs(float(figures["fp32_k3_fp32"])) < 1e-6 and float(figures["fp32_gap_fp32"]) < 1e-4
    arms, measures = ("bf16", "fp32", "bf16_router20"), ("k1", "k3", "gap")
    assert {f"{a}_{m}_{t}" for a in arms for m in measures for t in ("bf16", "fp32")} <= figures.keys()
    assert figures["layers"] == "1" and figures["prompts"] == "2" and figures["new"] == "4"


def test_bad_sizes_are_one_line() -> None:
    cmd = [sys.executable, str(ROOT / "benchmarks" / "engine_precision.py"), "--new", "0"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == ["engine_precision: --layers, --prompts and --new must be positive"]
