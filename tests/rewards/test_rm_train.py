"""``harmonyrl rm train``: learns an easy preference, logs held-out accuracy and calibration, saves a loadable model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harmonyrl.cli import app
from harmonyrl.cli.rm import rm_train_config
from harmonyrl.jobs.rm_train import split_by_prompt, train_reward_model
from harmonyrl.rewards.model import load_reward_model
from harmonyrl.telemetry.metrics import read_metrics

TOPICS = ["the sea", "a garden", "the night sky", "a market", "a library", "snow", "a train", "a bicycle"]


def _pairs(path: Path) -> Path:
    # the preferred answer is a sentence about the topic; the rejected one a curt refusal: easy to tell apart
    rows = [
        {"prompt": f"Describe {t}.", "chosen": f"Here is {t}: calm, bright and full of small details.", "rejected": r}
        for t in TOPICS
        for r in ("No.", "I will not.", "Nothing to say.")
    ]
    rows.append({"prompt": "Describe x.", "chosen": "same", "rejected": "same"})  # counted, skipped
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_split_by_prompt_keeps_prompts_apart(tmp_path: Path) -> None:
    from harmonyrl.rewards.pair_files import read_pairs

    pairs = read_pairs(_pairs(tmp_path / "p.jsonl")).pairs
    train, test = split_by_prompt(pairs, 0.25, seed=0)
    assert len(test) == 6 and len(train) == 18  # 2 of 8 prompts, 3 pairs each
    assert not {p.prompt for p in train} & {p.prompt for p in test}


def test_rm_train_learns_and_saves(tmp_path: Path) -> None:
    cfg = rm_train_config(
        [f"data={_pairs(tmp_path / 'p.jsonl')}", f"out={tmp_path / 'rm'}", "preset=nano", "steps=30",
         "batch_size=8", "lr=0.003", "held_out=0.25", "eval_every=10", "threads=1", "centring=0.01"]
    )  # fmt: skip
    result = train_reward_model(cfg)
    assert result.skipped == 1 and result.train_pairs == 18 and result.held_out_pairs == 6
    rows = read_metrics(tmp_path / "rm" / "metrics.jsonl")
    evals = [r for r in rows if r["phase"] == "rm_eval"]
    assert [r["step"] for r in evals] == [0, 10, 20, 30]
    assert evals[-1]["rm_eval/accuracy"] == 1.0 and 0 <= evals[-1]["rm_eval/ece"] <= 1
    assert result.accuracy == 1.0
    rm = load_reward_model(result.checkpoint)
    assert rm.max_len == 512


def test_cli_bad_input_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "p", "chosen": "a"}\n')
    got = CliRunner().invoke(app, ["rm", "train", f"data={bad}", f"out={tmp_path / 'o'}"])
    assert got.exit_code == 2 and "holds no usable preference pair" in got.output and "Traceback" not in got.output
    assert not (tmp_path / "o").exists()  # failed before any compute or folder


@pytest.mark.parametrize("override", ["held_out=1.5", "init_from=/nonexistent"])
def test_bad_settings_are_one_line(override: str, tmp_path: Path) -> None:
    got = CliRunner().invoke(app, ["rm", "train", f"data={tmp_path}", override])
    assert got.exit_code == 2 and "error:" in got.output and "Traceback" not in got.output
