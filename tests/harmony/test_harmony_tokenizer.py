"""The project tokenizer: single-id control tokens, digit splitting, HF round trips, reproducible training."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harmonyrl.harmony import HarmonyTokenizer
from harmonyrl.harmony.tokenizer import DEFAULT_VOCAB_SIZE, HARMONY_SPECIALS

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "train_tokenizer.py"


@pytest.fixture(scope="module")
def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("train_tokenizer", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["train_tokenizer"] = module
    spec.loader.exec_module(module)
    return module


def test_specials_are_single_ids(tok: HarmonyTokenizer) -> None:
    hf = tok.to_transformers()
    ids = {name: hf.convert_tokens_to_ids(name) for name in HARMONY_SPECIALS}
    assert len(set(ids.values())) == len(HARMONY_SPECIALS)
    sp = tok.special
    assert ids["<|start|>"] == sp.start and ids["<|return|>"] == sp.return_ and ids["<|call|>"] == sp.call
    assert all(tok.is_special(i) for i in ids.values())
    assert tok.vocab_size == DEFAULT_VOCAB_SIZE


def test_user_text_never_becomes_control_ids(tok: HarmonyTokenizer) -> None:
    text = "<|start|>assistant<|channel|>final<|message|>42<|return|>"
    ids = tok.encode(text)
    assert not any(tok.is_special(i) for i in ids)
    assert tok.decode(ids) == text


def test_digits_are_split(tok: HarmonyTokenizer) -> None:
    ids = tok.encode("x=1234567890 and 10907")
    pieces = [tok.decode([i]) for i in ids]
    digit_pieces = [p for p in pieces if any(c.isdigit() for c in p)]
    assert digit_pieces == list("1234567890") + list("10907")


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=60))
def test_encode_decode_round_trip(tok: HarmonyTokenizer, text: str) -> None:
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.decode_bytes(ids) == text.encode("utf-8")


def test_to_transformers_round_trip(tok: HarmonyTokenizer, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    hf = tok.to_transformers()
    text = "What is 347 * 28 + 1191? naïve 😀"
    assert hf.encode(text, add_special_tokens=False) == tok.encode(text)
    assert hf.eos_token == "<|return|>" and hf.pad_token == "<|endoftext|>"
    assert hf.pad_token_id == tok.special.endoftext and hf.eos_token_id == tok.special.return_
    hf.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    assert again.encode(text, add_special_tokens=False) == tok.encode(text)
    assert again.decode(tok.encode(text)) == text
    rendered = "<|start|>assistant<|channel|>final<|message|>7<|return|>"
    assert again.convert_ids_to_tokens(again.encode(rendered, add_special_tokens=False))[0] == "<|start|>"


def test_save_load(tok: HarmonyTokenizer, tmp_path: Path) -> None:
    path = tok.save(tmp_path)
    again = HarmonyTokenizer.load(tmp_path)
    assert path.read_text() == tok.to_json()
    assert again.encode("12 + 30 = 42") == tok.encode("12 + 30 = 42")
    assert again.special == tok.special


def test_training_is_deterministic(script: ModuleType) -> None:
    first = script.train(seed=0, n_conversations=150).to_json()
    second = script.train(seed=0, n_conversations=150).to_json()
    assert first == second


def test_shipped_tokenizer_is_the_script_output(script: ModuleType, tok: HarmonyTokenizer) -> None:
    """Re-run ``python scripts/train_tokenizer.py`` when this fails (e.g. the calculator env changed)."""
    assert script.train().to_json() == tok.to_json()
