"""``harmonyrl train`` with ``reward.model`` and ``reward.judge``: every RL step logs each term and its agreement with
the code checkers; a bad ``reward`` section is one line before any compute."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harmonyrl.cli import app
from harmonyrl.config import ConfigError, load_config
from harmonyrl.harmony.codecs import load_codec
from harmonyrl.models.tiny_gpt_oss import build_config, build_model
from harmonyrl.rewards.model import RewardModel, save_reward_model
from tiny_run import tiny_run


def _rm(tmp_path: Path, tokenizer: str = "harmonyrl_bpe") -> Path:
    tok = load_codec("harmonyrl_bpe")
    lm = build_model(build_config("nano", tok.vocab_size, tok.special.endoftext, tok.special.return_), seed=0)
    return save_reward_model(RewardModel(lm, tokenizer, 256), tmp_path / "rm")  # type: ignore[arg-type]


def test_run_logs_model_and_judge_terms(tmp_path: Path) -> None:
    overrides = tiny_run("env.name=instruct", f"reward.model={_rm(tmp_path)}", "reward.model_weight=0.5",
                         "reward.judge.max_new_tokens=4", "threads=1", f"output_dir={tmp_path}", "run_name=r",
                         "telemetry.record_rollouts=false")  # fmt: skip
    got = CliRunner().invoke(app, ["train", *overrides])
    assert got.exit_code == 0, got.output
    rows = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r["phase"] == "rl"]
    assert len(rl) == 2
    for row in rl:
        assert "reward/model" in row and "reward/env" in row and "rm/seconds" in row
        assert "judge/tokens_per_episode" in row and "judge/parse_failures" in row
        # an untrained nano judge rarely says a number: its failures mask episodes, counted as reward_error
        assert row.get("env/failure_reward_error", 0.0) == row["judge/parse_failures"]


def test_bad_reward_sections_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is not a reward model folder"):
        load_config(None, [f"reward.model={tmp_path}"])
    with pytest.raises(ConfigError, match="uses tokenizer o200k_harmony"):
        load_config(None, [f"reward.model={_rm(tmp_path, 'o200k_harmony')}"])
    with pytest.raises(ConfigError, match=r"reward\.judge\.checkpoint"):
        load_config(None, [f"reward.judge.checkpoint={tmp_path}"])
