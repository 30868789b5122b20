"""The report points at docs/diagnosing-mismatch.md when sampler and trainer disagree, and only then."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from harmonyrl.cli import app
from harmonyrl.telemetry.mismatch_note import mismatch_note
from harmonyrl.telemetry.report import write_report
from harmonyrl.telemetry.series import Series


def _series(kl: list[float], dev: float = 0.0, agreement: float = 1.0) -> Series:
    steps = list(range(1, len(kl) + 1))
    return {
        "mismatch/kl_k3": (steps, kl),
        "train/ratio_max_dev_first_mb": (steps, [dev] * len(kl)),
        "routing/agreement": (steps, [agreement] * len(kl)),
    }


def test_matched_kernels_are_quiet() -> None:
    # (d) of benchmarks/retrospective.py: KL ~1e-13, ratio exactly 1, agreement 1
    assert mismatch_note(_series([1.4e-13, 2e-13, 1e-13])) is None
    assert mismatch_note({}) is None  # a run that recorded none of the three


def test_sinkless_kl_is_named_with_its_worst_step_and_mean() -> None:
    note = mismatch_note(_series([1.7, 0.2, 0.1]))  # mean 2.0 / 3
    assert note is not None
    assert "mismatch KL reaches 1.7 per token (step 1; mean 0.67" in note
    assert note.endswith("What to read, in order: docs/diagnosing-mismatch.md in harmonyrl's source.")
    assert "on-policy ratio" not in note and "routing" not in note


def test_each_threshold_is_inclusive_of_noise_only() -> None:
    assert mismatch_note(_series([1e-3])) is None  # at the threshold: quiet
    assert mismatch_note(_series([1e-13], dev=1e-5)) is None
    assert mismatch_note(_series([1e-13], agreement=0.999)) is None
    dev = mismatch_note(_series([1e-13], dev=0.02))
    assert dev is not None and "strays from 1 by 0.02 (step 1)" in dev
    routing = mismatch_note(_series([1.5e-4, 1e-4], agreement=0.9955))
    assert routing is not None and "routing agreement falls to 0.9955 (step 1)" in routing and "KL" not in routing


def test_non_finite_points_are_ignored() -> None:
    assert mismatch_note(_series([float("nan"), 1e-13])) is None


def test_report_page_and_console_carry_the_note(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"step": s, "phase": "rl", "mismatch/kl_k3": kl, "rollout/reward": 0.1} for s, kl in [(1, 0.64), (2, 0.3)]]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert "diagnosing-mismatch.md" in write_report(run).read_text()
    result = CliRunner().invoke(app, ["report", str(run)])
    assert result.exit_code == 0, result.output
    assert "mismatch KL reaches 0.64" in result.output and "diagnosing-mismatch.md" in result.output
