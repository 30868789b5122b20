"""A real ``harmonyrl sweep``: 6 tiny trials on the calculator task, 2 at a time, from one shared warm start."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from harmonyrl.cli import app
from harmonyrl.config import load_config
from tiny_run import tiny_run

runner = CliRunner()


@pytest.mark.slow
def test_six_trial_study_on_the_calculator(tmp_path: Path) -> None:
    warm = runner.invoke(app, ["sft", *tiny_run("threads=1"), f"output_dir={tmp_path}", "run_name=warm"])
    assert warm.exit_code == 0, warm.output
    start = tmp_path / "warm" / "checkpoints" / "sft"
    # the tiny run without its SFT keys (every trial starts from the shared checkpoint: sft.steps resolves to 0) and
    # without the searched group size (a key both fixed and searched is an error)
    trial_run = [o for o in tiny_run("rl.steps=4", "threads=1") if not o.startswith(("sft.", "rollout.group_size="))]
    out = tmp_path / "sweep"
    space = ["--param", "rl.lr=log:1e-5:1e-3", "--param", "rollout.group_size=choice:2,4"]
    sweep = ["sweep", "--out", str(out), "--trials", "6", "--jobs", "2", *space]
    result = runner.invoke(app, [*sweep, f"model.init_from={start}", *trial_run])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "objective: held-out pass@1 after RL" in text and "eval.every=1" in text  # a quarter of rl.steps=4
    assert "2 at a time, threads=1 each" in text

    with (out / "trials.csv").open() as f:
        table = list(csv.DictReader(f))
    assert [r["trial"] for r in table] == [str(i) for i in range(6)]
    assert all(r["state"] in ("complete", "pruned") for r in table), table  # no trial failed
    assert all(r["rollout.group_size"] in ("2", "4") and 1e-5 <= float(r["rl.lr"]) <= 1e-3 for r in table)
    assert len({r["rl.lr"] for r in table}) == 6
    best = load_config(out / "best_config.yaml")  # a config `train -c` accepts
    assert best.model.init_from == start and best.rl.steps == 4 and best.run_name is None and best.eval.every == 0
    assert any(float(r["rl.lr"]) == best.rl.lr for r in table if r["state"] == "complete")
    assert (out / "trials.png").stat().st_size > 1000

    for r in table:
        run = Path(r["run_dir"])
        cfg = yaml.safe_load((run / "config.yaml").read_text())
        assert cfg["sft"]["steps"] == 0 and cfg["threads"] == 1  # no SFT redone, each trial its share of the cores
        assert not (run / "checkpoints" / "sft").exists()
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert not [row for row in rows if row["phase"] == "sft"]
        periodic = [row["step"] for row in rows if row["phase"] == "rl" and "eval/success" in row]
        assert periodic[:1] == [1]  # the pruner was fed from the run's own periodic held-out evaluation
        if r["state"] == "complete":
            assert periodic == [1, 2, 3]
            summary = json.loads((run / "summary.json").read_text())
            assert float(r["value"]) == pytest.approx(summary["success_after"], abs=1e-6)
