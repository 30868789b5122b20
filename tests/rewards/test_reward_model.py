"""The reward model: a row's score does not depend on padding or batch-mates; the checkpoint loads on its own."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from harmonyrl.errors import CheckpointError
from harmonyrl.harmony.codecs import load_codec
from harmonyrl.models.tiny_gpt_oss import build_config, build_model
from harmonyrl.rewards.model import RewardModel, answer_ids, load_reward_model, save_reward_model
from harmonyrl.types import Message


def _rm() -> RewardModel:
    tok = load_codec("harmonyrl_bpe")
    lm = build_model(build_config("nano", tok.vocab_size, tok.special.endoftext, tok.special.return_), seed=0)
    return RewardModel(lm, "harmonyrl_bpe", max_len=256, seed=1)


def _rows() -> list[list[int]]:
    tok = load_codec("harmonyrl_bpe")
    prompt = (Message(role="user", content="Describe the sea."),)
    answers = ["The sea is wide and grey.", "Sea.", "Waves, salt and wind all along the shore today."]
    return [answer_ids(tok, prompt, (Message(role="assistant", channel="final", content=a),), 256) for a in answers]


def test_rows_end_with_return() -> None:
    tok = load_codec("harmonyrl_bpe")
    assert all(r[-1] == tok.special.return_ for r in _rows())


def test_score_invariant_to_padding_and_batch() -> None:
    rm, rows = _rm(), _rows()
    alone = [rm.score([r])[0] for r in rows]
    together = rm.score(rows, batch_size=3)  # rows 0 and 1 padded to row 2's length
    assert together == pytest.approx(alone, abs=1e-5)
    assert len(set(round(s, 6) for s in alone)) == 3  # distinct answers, distinct scores: the test can fail


def test_score_reads_the_last_real_token() -> None:
    rm, rows = _rm(), _rows()
    ids, mask = rm.batch(rows)
    wrong = rm(ids, torch.ones_like(mask))  # as if the pads were tokens: the short rows' scores change
    right = rm(ids, mask)
    assert not torch.allclose(wrong[:2], right[:2])


def test_checkpoint_round_trip(tmp_path: Path) -> None:
    rm, rows = _rm(), _rows()
    with torch.no_grad():
        rm.head.bias.fill_(0.25)
    saved = save_reward_model(rm, tmp_path / "rm")
    loaded = load_reward_model(saved)
    assert loaded.tokenizer == "harmonyrl_bpe" and loaded.max_len == 256
    assert loaded.score(rows) == pytest.approx(rm.score(rows), abs=1e-6)


def test_not_a_reward_model_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="is not a reward model folder"):
        load_reward_model(tmp_path)
