"""The fair-comparison arithmetic of the changed benchmarks on hand-made runs (issue 41 item 3): interpolated time
to target, ratios paired by seed with their standard errors, compute-matched arms, equal budgets."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from benchmark_module import BENCHMARKS, load_benchmark

async_bench = load_benchmark("async")
vs_trl = load_benchmark("vs_trl")


def _async_arm(k: int, seed: int, threads: int, curve: list[tuple[float, float]]) -> object:
    return async_bench.Arm(k, seed, threads, curve, 0.0, 0.0, "1.0")


def test_async_speedups_plain_and_compute_matched_with_their_standard_errors() -> None:
    # start 0.30, sync finals 0.50 -> target 0.40, reached (interpolated) by sync at 120 s, sync2 at 90, async2 at 60
    runs = []
    for seed, stretch in ((0, 1.0), (1, 2.0)):  # seed 1 runs everything twice as slowly
        runs += [_async_arm(0, seed, 1, [(0, 0.3), (240 * stretch, 0.5)]),
                 _async_arm(0, seed, 2, [(0, 0.3), (180 * stretch, 0.5)]),
                 _async_arm(2, seed, 1, [(0, 0.3), (120 * stretch, 0.5)])]  # fmt: skip
    line = async_bench.summary(runs)
    assert "sync_min=3.00 sync2_min=2.25 async2_min=1.50" in line  # means over seeds: (2 + 4) / 2 etc.
    assert "speedup=2.00 speedup_se=0.00 speedup_matched=1.50 speedup_matched_se=0.00" in line
    assert "final_gap_pp=0.0" in line and line.endswith("(k=2) seeds=0,1")


def _trl_arm(name: str, curve: list[tuple[int, float, float]], s_per_step: float, se: float = 0.02) -> object:
    arm = vs_trl.Arm(name, curve=curve, step_s=[s_per_step] * 4)
    arm.notes["final_se"] = se
    return arm


def test_vs_trl_time_to_target_is_interpolated_and_ratios_are_paired_by_seed() -> None:
    # target 0.40: ours crosses between 60 s (0.36) and 120 s (0.46) -> 84 s; TRL between 240 s (0.30) and 480 s
    # (0.50) -> 360 s. Reading the next evaluation instead would give 120 s and 480 s.
    runs = {
        0: {"harmonyrl": _trl_arm("harmonyrl", [(0, 0, 0.3), (2, 60, 0.36), (4, 120, 0.46)], 30.0),
            "trl": _trl_arm("trl", [(0, 0, 0.3), (2, 240, 0.30), (4, 480, 0.50)], 120.0)},
        1: {"harmonyrl": _trl_arm("harmonyrl", [(0, 0, 0.3), (4, 120, 0.5)], 30.0),
            "trl": _trl_arm("trl", [(0, 0, 0.3), (4, 480, 0.6)], 90.0)},
    }  # fmt: skip
    assert runs[0]["harmonyrl"].minutes_to(0.40) == pytest.approx(84 / 60)
    line = vs_trl.result(runs, 0.40)
    # seed 1: TRL reaches 0.40 at 160 s, ours at 60 s; the speed-up is the mean ± SE of the two per-seed ratios
    trl1 = 480 * (0.40 - 0.3) / (0.6 - 0.3)  # 160 s
    ours1 = 120 * (0.40 - 0.3) / (0.5 - 0.3)  # 60 s
    ratios = [360 / 84, trl1 / ours1]
    mean, se = sum(ratios) / 2, abs(ratios[0] - ratios[1]) / 2
    assert f"speedup={mean:.2f} speedup_se={se:.2f}" in line
    assert "step_ratio=3.50 step_ratio_se=0.50" in line  # 120/30 and 90/30
    assert "reached=ours:2/2,trl:2/2 seeds=0,1" in line


def test_vs_trl_a_trainer_that_never_reaches_the_target_is_counted_not_averaged() -> None:
    runs = {0: {"harmonyrl": _trl_arm("harmonyrl", [(0, 0, 0.3), (4, 120, 0.5)], 30.0),
                "trl": _trl_arm("trl", [(0, 0, 0.3), (4, 480, 0.35)], 120.0)}}  # fmt: skip
    line = vs_trl.result(runs, 0.40)
    assert "trl_min_to_target=none" in line and "speedup=none" in line and "reached=ours:1/1,trl:0/1" in line
    assert "final_diff_pp=15.0 final_diff_se=2.8" in line  # one seed: hypot of the two evaluations' SEs (2 pp each)


def test_multiagent_refuses_a_team_only_budget() -> None:
    cmd = [sys.executable, str(BENCHMARKS / "multiagent.py"), "--team", "sft.steps=800"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 2 and "a team-only budget makes the comparison unfair" in out.stderr


def test_memory_arms_change_one_thing_each() -> None:
    memory = load_benchmark("memory")
    assert memory.VARIANTS == ("full", "full_ckpt", "lora", "lora_ckpt", "full_unchunked")


def test_scaling_cpu_tool_is_fixed_work() -> None:
    scaling = load_benchmark("scaling")
    assert scaling.spin(1000) == scaling.spin(1000)
    assert scaling.iterations_for(0.01) >= 1
    assert math.isfinite(scaling.iterations_for(0.001))
