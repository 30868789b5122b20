"""``harmonyrl check-mismatch`` on the embedded engine: a matched run passes, a deliberately mismatched kernel
fails with exit 1 and one line, bad input is a one-line error (exit 2). A few seconds each (a nano model)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from harmonyrl.cli import app
from tiny_run import tiny_run

runner = CliRunner()
GATE = ["check-mismatch", "--steps", "3", *tiny_run("rollout.group_size=4", "threads=1")]


def _last_line(output: str) -> str:
    return output.strip().splitlines()[-1]


def test_the_embedded_engine_passes_the_gate(tmp_path: Path) -> None:
    result = runner.invoke(app, [*GATE, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    line = " ".join(result.output.split())
    assert "mismatch gate passed" in line and "over 3 RL steps" in line and "(embedded engine, fp32)" in line


@pytest.mark.parametrize(
    "broken",
    [
        "model.engine_sinks=false",  # the engine drops the attention sinks the trainer honours
        "model.attention=harmonyrl_sinkless",  # the trainer's kernel drops them (the public retrospective's bug)
    ],
)
def test_a_mismatched_kernel_fails_the_gate(tmp_path: Path, broken: str) -> None:
    result = runner.invoke(app, [*GATE, broken, "--out", str(tmp_path)])
    assert result.exit_code == 1, result.output
    line = _last_line(result.output)
    assert line.startswith("error: mismatch gate failed") and "> bound 1e-06" in line
    assert str(tmp_path / "gate") in " ".join(result.output.split())


def test_a_bf16_engine_is_judged_at_the_bf16_bound(tmp_path: Path) -> None:
    result = runner.invoke(app, [*GATE, "rollout.engine.dtype=bfloat16", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "bf16)" in " ".join(result.output.split())


def test_an_explicit_bound_decides(tmp_path: Path) -> None:
    # the sink-less engine's ~1e-5..1e-4 per token fails the fp32 bound (above); a bound of 1 lets it through
    result = runner.invoke(app, [*GATE, "model.engine_sinks=false", "--max-kl", "1", "--out", str(tmp_path)])
    assert result.exit_code == 0 and "<= bound 1 (embedded engine without sinks, fp32)" in _last_line(result.output)


@pytest.mark.parametrize("bound", ["0", "-1", "nan", "inf", "tight"])
def test_a_bound_that_is_not_a_positive_number_is_one_line(bound: str) -> None:
    result = runner.invoke(app, [*GATE, "--max-kl", bound])
    assert result.exit_code == 2
    assert result.output.strip().count("\n") == 0 and result.output.startswith("error: --max-kl must be")


def test_a_bad_override_is_one_line() -> None:
    result = runner.invoke(app, [*GATE, "rollout.engine.dtype=fp8"])
    assert result.exit_code == 2 and result.output.strip().count("\n") == 0
