"""``harmonyrl sft --export-demos`` then ``sft.demos=FILE``: the expert's warm start reproduced from a file, and a
file with bad lines reported into the run folder, or refused in one line when nothing in it is usable."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from harmonyrl.cli import app

runner = CliRunner()
SFT = [
    "model.preset=nano",
    "sft.steps=8",
    "sft.batch_size=4",
    "sft.warmup_steps=2",
    "sft.lr=3e-3",
    "env.n_train=64",
    "env.n_test=8",
    "threads=1",
]


def _sft_rows(run: Path) -> list[dict[str, float]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["phase"] == "sft"]


def _one_line(output: str) -> str:
    lines = output.strip().splitlines()
    assert len(lines) == 1, output
    return lines[0]


def test_a_file_of_the_experts_demos_trains_the_same_weights_as_the_expert(tmp_path: Path) -> None:
    demos = tmp_path / "calc.jsonl"
    export = runner.invoke(app, ["sft", "--export-demos", str(demos), *SFT])
    assert export.exit_code == 0, export.output
    assert len(demos.read_text().splitlines()) == 32  # sft.steps x sft.batch_size tasks, as the expert path uses
    expert = runner.invoke(app, ["sft", *SFT, f"output_dir={tmp_path}", "run_name=expert"])
    assert expert.exit_code == 0, expert.output
    from_file = runner.invoke(app, ["sft", *SFT, f"sft.demos={demos}", f"output_dir={tmp_path}", "run_name=file"])
    assert from_file.exit_code == 0, from_file.output
    assert "demos: 32 used, 0 skipped" in from_file.output
    a, b = (load_file(str(tmp_path / run / "checkpoints/sft/model.safetensors")) for run in ("expert", "file"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # same demos, same batches, same steps
    rows = _sft_rows(tmp_path / "file")
    assert (rows[0]["sft/demos_used"], rows[0]["sft/demos_skipped"]) == (32, 0)
    assert rows[-1]["sft/loss"] < rows[0]["sft/loss"] - 0.5  # it learns (measured: 6.91 -> 5.40 in 8 steps)
    assert (tmp_path / "file/demos_report.jsonl").read_text() == ""  # nothing to report


def test_bad_lines_are_summarised_and_written_to_the_run_folder(tmp_path: Path) -> None:
    demos = tmp_path / "calc.jsonl"
    assert runner.invoke(app, ["sft", "--export-demos", str(demos), *SFT]).exit_code == 0
    lines = demos.read_text().splitlines()
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join([lines[0], "{oops", lines[1], '{"messages": []}']) + "\n")
    run = ["sft.steps=2", f"sft.demos={bad}", f"output_dir={tmp_path}", "run_name=r"]
    result = runner.invoke(app, ["sft", *SFT, *run])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())  # rich wraps long lines
    assert "demos: 2 used, 2 skipped: 1 invalid JSON (line 2), 1 schema error (line 4)" in said
    report = [json.loads(line) for line in (tmp_path / "r/demos_report.jsonl").read_text().splitlines()]
    assert [(r["number"], r["kind"], r["skipped"]) for r in report] == [(2, "invalid", True), (4, "invalid", True)]
    assert _sft_rows(tmp_path / "r")[0]["sft/demos_skipped"] == 2


def test_a_file_with_nothing_usable_or_no_file_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{oops\n")
    result = runner.invoke(app, ["sft", *SFT, f"sft.demos={bad}", f"output_dir={tmp_path}", "run_name=r"])
    assert result.exit_code == 2
    line = _one_line(" ".join(result.output.split("\n")))
    assert line.startswith(f"error: sft.demos: no usable demonstration in '{bad}': demos: 0 used, 1 skipped")
    assert not (tmp_path / "r").exists()  # an unstarted run folder is not left behind
    kept = Path(line.rsplit("; every issue in ", 1)[1])  # ... so the report it names is kept elsewhere
    assert [json.loads(row)["kind"] for row in kept.read_text().splitlines()] == ["invalid"]
    kept.unlink()
    missing = runner.invoke(app, ["sft", *SFT, f"sft.demos={tmp_path}/none.parquet", f"output_dir={tmp_path}"])
    assert missing.exit_code == 2 and "does not exist" in _one_line(" ".join(missing.output.split("\n")))
