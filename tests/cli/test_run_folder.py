"""A run that fails before its first step leaves no folder behind; anything further is kept unless --overwrite."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

import harmonyrl.sft.warm_start as warm_start
from harmonyrl.cli import app

runner = CliRunner()
SFT = [
    "model.preset=nano",
    "sft.steps=4",
    "sft.batch_size=4",
    "sft.checkpoint_every=2",
    "env.n_train=64",
    "env.n_test=8",
]


def _one_line(output: str) -> str:
    assert len(output.strip().splitlines()) == 1 or "Traceback" not in output, output
    return " ".join(output.split())


@pytest.mark.parametrize("error", [RuntimeError("no demos"), KeyboardInterrupt()])
@pytest.mark.parametrize("command", ["sft", "train"])
def test_a_run_that_fails_before_its_first_step_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str, error: BaseException
) -> None:
    async def fail(*args: object) -> object:
        raise error

    monkeypatch.setattr(warm_start, "build_demos", fail)
    result = runner.invoke(app, [command, *SFT, f"output_dir={tmp_path}"])  # default name: a timestamp
    assert result.exit_code != 0  # 1 for the exception, 130 for Ctrl-C
    assert list(tmp_path.iterdir()) == []
    result = runner.invoke(app, [command, *SFT, f"output_dir={tmp_path}", "run_name=mine"])
    assert result.exit_code != 0 and not (tmp_path / "mine").exists()
    monkeypatch.undo()
    again = runner.invoke(app, ["sft", *SFT, f"output_dir={tmp_path}", "run_name=mine"])  # the name is free
    assert again.exit_code == 0, again.output


def test_a_run_with_steps_is_kept_and_only_overwrite_replaces_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real, calls = warm_start.sft_step, [0]

    def dies_at_step_3(*args: object) -> float:
        calls[0] += 1
        if calls[0] == 3:
            raise RuntimeError("killed")
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(warm_start, "sft_step", dies_at_step_3)
    first = runner.invoke(app, ["sft", *SFT, f"output_dir={tmp_path}", "run_name=r"])
    assert first.exit_code == 1 and "RuntimeError: killed" in first.output  # the harness error, in one line
    run = tmp_path / "r"
    assert (run / "checkpoints" / "last").is_dir()  # a checkpoint: kept
    monkeypatch.undo()

    refused = runner.invoke(app, ["sft", *SFT, f"output_dir={tmp_path}", "run_name=r"])
    assert refused.exit_code == 2
    text = _one_line(refused.output)
    assert "already exists" in text and "--resume" in text and "--overwrite" in text
    assert (run / "checkpoints" / "last").is_dir()

    replaced = runner.invoke(app, ["sft", "--overwrite", *SFT, f"output_dir={tmp_path}", "run_name=r"])
    assert replaced.exit_code == 0, replaced.output
    rows = (run / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 4  # the new run's 4 steps, not 2 old + 4 new


def test_a_run_with_metrics_but_no_checkpoint_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real, calls = warm_start.sft_step, [0]

    def dies_at_step_2(*args: object) -> float:
        calls[0] += 1
        if calls[0] == 2:
            raise RuntimeError("killed")
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(warm_start, "sft_step", dies_at_step_2)
    result = runner.invoke(app, ["sft", *SFT, f"output_dir={tmp_path}", "run_name=r"])
    assert result.exit_code == 1 and "RuntimeError: killed" in result.output  # the harness error, in one line
    assert len((tmp_path / "r" / "metrics.jsonl").read_text().splitlines()) == 1


def test_overwrite_only_replaces_run_folders(tmp_path: Path) -> None:
    precious = tmp_path / "notes"
    precious.mkdir()
    (precious / "thesis.tex").write_text("years of work")
    result = runner.invoke(app, ["sft", "--overwrite", *SFT, f"output_dir={tmp_path}", "run_name=notes"])
    assert result.exit_code == 2 and "not a run folder" in _one_line(result.output)
    assert (precious / "thesis.tex").read_text() == "years of work"


def test_resume_with_overwrite_is_refused(tmp_path: Path) -> None:
    result = runner.invoke(app, ["train", "--resume", str(tmp_path), "--overwrite"])
    assert result.exit_code == 2 and "do not pass --config, overrides or --overwrite" in _one_line(result.output)
