"""The mismatch gate's pieces: the bound's parsing, the precision a run is judged at, the verdict, and what it
reads from a run's metrics."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from harmonyrl.config import load_config
from harmonyrl.jobs.check_mismatch import BOUNDS, GateInputError, GateResult, gate_precision, parse_bound, step_kls


@pytest.mark.parametrize("text", ["0", "-1e-6", "nan", "inf", "abc", ""])
def test_a_bound_that_is_not_a_positive_number_is_refused(text: str) -> None:
    with pytest.raises(GateInputError, match="--max-kl must be") as e:
        parse_bound(text)
    assert "\n" not in str(e.value)


def test_a_positive_bound_is_read() -> None:
    assert parse_bound("2.5e-4") == 2.5e-4 and parse_bound(None) is None


@pytest.mark.parametrize(
    ("overrides", "precision"),
    [
        ([], "fp32"),
        (["rollout.engine.dtype=bfloat16"], "bf16"),
        (["model.precision=bf16"], "bf16"),
        (["rollout.engine.kind=vllm", "rollout.engine.model=p"], "bf16"),  # weights synced in bf16 by default
        (["rollout.engine.kind=vllm", "rollout.engine.model=p", "rollout.engine.sync_dtype=float32"], "fp32"),
    ],
)
def test_the_precision_is_bf16_when_either_side_is(overrides: list[str], precision: str) -> None:
    assert gate_precision(load_config(None, overrides)) == precision


def test_the_verdict_is_the_mean_of_the_steps_against_the_bound(tmp_path: Path) -> None:
    # steps 1..3 with KL 1e-7, 4e-7, 1e-6: mean 5e-7, worst step 3
    kls = ((1, 1e-7), (2, 4e-7), (3, 1e-6))
    passed = GateResult(kls, 6e-7, "fp32", "embedded engine", tmp_path)
    assert passed.mean == pytest.approx(5e-7) and passed.worst == (3, 1e-6) and passed.passed
    assert passed.line().startswith("mismatch gate passed: mean KL(sampler ‖ trainer) 5e-07 per token over 3")
    failed = GateResult(kls, 4e-7, "fp32", "embedded engine", tmp_path)
    assert not failed.passed and "5e-07 per token" in failed.line() and "> bound 4e-07" in failed.line()
    assert str(tmp_path) in failed.line() and "\n" not in failed.line()


def test_no_measurement_or_a_nan_fails(tmp_path: Path) -> None:
    assert not GateResult((), 1.0, "fp32", "e", tmp_path).passed
    assert "no RL step measured" in GateResult((), 1.0, "fp32", "e", tmp_path).line()
    assert not GateResult(((1, 0.0), (2, math.nan)), 1.0, "fp32", "e", tmp_path).passed


def test_the_steps_are_read_from_the_rl_rows(tmp_path: Path) -> None:
    rows = [
        {"step": 0, "phase": "eval", "eval/success": 0.5},
        {"step": 1, "phase": "rl", "mismatch/kl_k3": 2e-9},
        {"step": 2, "phase": "rl", "mismatch/kl_k3": "nan"},  # the sink writes non-finite floats as strings
        {"step": 3, "phase": "rl", "rollout/reward": 0.0},  # a step that measured nothing
    ]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = step_kls(path)
    assert got[0] == (1, 2e-9) and got[1][0] == 2 and math.isnan(got[1][1]) and len(got) == 2


def test_the_fp32_bound_is_tighter() -> None:
    assert 0 < BOUNDS["fp32"] < BOUNDS["bf16"]
