"""``model.tokenizer=o200k_harmony`` end to end through the CLI: a very short train on GPT-OSS's real vocabulary
whose sampled completions parse, whose checkpoint carries a tokenizer AutoTokenizer loads, and whose checkpoint
the other tokenizer refuses with a one-line error naming ``model.tokenizer``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer
from typer.testing import CliRunner

from harmonyrl.cli import app
from harmonyrl.harmony import O200kCodec, parse_completion
from harmonyrl.rollout.store import read_step, step_path
from tiny_run import tiny_run

runner = CliRunner()
O200K = tiny_run("model.tokenizer=o200k_harmony", "sft.steps=2", "rl.steps=1", "eval.n_tasks=2", "threads=1")


@pytest.fixture(scope="module")
def o200k_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("bpe_openai")
    out = tmp_path_factory.mktemp("runs")
    result = runner.invoke(app, ["train", *O200K, f"output_dir={out}", "run_name=o200k"])
    assert result.exit_code == 0, result.output
    return out / "o200k"


def _sampled_spans(token_ids: tuple[int, ...], mask: tuple[int, ...]) -> list[list[int]]:
    spans: list[list[int]] = [[]]
    for token, m in zip(token_ids, mask, strict=True):
        if m:
            spans[-1].append(token)
        elif spans[-1]:
            spans.append([])
    return [s for s in spans if s]


def test_o200k_run_builds_the_real_vocabulary_and_its_completions_parse(o200k_run: Path) -> None:
    config = json.loads((o200k_run / "checkpoints" / "final" / "config.json").read_text())
    assert config["vocab_size"] == 201_088 and config["eos_token_id"] == 200_002 and config["pad_token_id"] == 199_999
    assert "tie_word_embeddings" not in config or config["tie_word_embeddings"] is False  # as GPT-OSS: untied
    codec = O200kCodec()
    trajectories = read_step(step_path(o200k_run, 1))
    assert trajectories and all(t.num_sampled > 0 for t in trajectories)
    for traj in trajectories:
        spans = _sampled_spans(traj.token_ids, traj.loss_mask)
        assert len(spans) == len(traj.turns)
        assert max(traj.token_ids) < 201_088
        for span, turn in zip(spans, traj.turns, strict=True):
            parsed = parse_completion(codec, span)
            # an untrained model mostly samples malformed turns: a typed format error, never a codec failure,
            # and exactly what the rollout recorded for that turn
            assert parsed.error is None or parsed.error.kind != "unknown_token", parsed.error
            assert (parsed.error is None) == (turn.parse_error is None)
            if parsed.error is None:
                assert parsed.messages == turn.sampled


def test_o200k_checkpoint_carries_its_tokenizer(o200k_run: Path) -> None:
    hf = AutoTokenizer.from_pretrained(o200k_run / "checkpoints" / "final")
    codec = O200kCodec()
    text = 'What is 347 * 28 + 1191? {"expression": "347 * 28 + 1191"} 日本語'
    assert len(hf) == 201_088 and hf.encode(text, add_special_tokens=False) == codec.encode(text)


def test_the_other_tokenizer_refuses_the_checkpoint_in_one_line(o200k_run: Path) -> None:
    ckpt = o200k_run / "checkpoints" / "final"
    result = runner.invoke(app, ["eval", "--checkpoint", str(ckpt), "eval.n_tasks=2"])
    assert result.exit_code == 2
    message = " ".join(result.output.split())
    assert "has vocab 201088, the tokenizer has 1024: set model.tokenizer=o200k_harmony" in message
    assert "Traceback" not in result.output


def test_unknown_tokenizer_is_a_config_error_listing_the_choices() -> None:
    result = runner.invoke(app, ["train", "model.tokenizer=foo"])
    assert result.exit_code == 2
    assert "model.tokenizer" in result.output and "'harmonyrl_bpe' or 'o200k_harmony'" in result.output
