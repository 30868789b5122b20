"""``model.tokenizer``: the codec each choice builds, and o200k_harmony saved in transformers' layout."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer, GptOssConfig

from harmonyrl.harmony import HarmonyTokenizer, O200kCodec, render_conversation, system_message
from harmonyrl.harmony.codecs import VOCAB_SIZES, load_codec, save_pretrained, tokenizer_for_vocab, vocab_mismatch
from harmonyrl.harmony.tokenizer import O200K_HARMONY_SPECIALS
from harmonyrl.types import Message

TEXTS = [
    "What is 347 * 28 + 1191?",
    "  spaces\n\n\ttabs  and 1234567 digits",
    "日本語 😀 naïve café — «ok»",
    "It's don't WE'LL 3.14159e-10",
    '{"expression": "(12 - 7) * 33"}',
    "",
]
"""Plain text (control-token look-alikes aside: the saved tokenizer parses them, as GPT-OSS's does; see below)."""


@pytest.fixture(scope="module")
def o200k_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("bpe_openai")
    return save_pretrained(load_codec("o200k_harmony"), tmp_path_factory.mktemp("o200k"))


def test_each_choice_builds_its_codec() -> None:
    assert isinstance(load_codec("harmonyrl_bpe"), HarmonyTokenizer)
    o200k = load_codec("o200k_harmony")
    assert isinstance(o200k, O200kCodec)
    # GPT-OSS's released config: 201,088 ids (o200k_harmony's 199,998 BPE ranks + 1,090 special ids)
    assert o200k.vocab_size == GptOssConfig().vocab_size == VOCAB_SIZES["o200k_harmony"] == 201_088
    assert load_codec("harmonyrl_bpe").vocab_size == VOCAB_SIZES["harmonyrl_bpe"] == 1024
    with pytest.raises(ValueError, match="harmonyrl_bpe"):
        load_codec("foo")  # type: ignore[arg-type]


def test_vocab_mismatch_names_the_tokenizer_that_fits() -> None:
    bpe, o200k = load_codec("harmonyrl_bpe"), load_codec("o200k_harmony")
    assert vocab_mismatch("checkpoint 'x'", 1024, bpe) is None
    assert vocab_mismatch("checkpoint 'x'", 201_088, o200k) is None
    assert vocab_mismatch("checkpoint 'x'", 201_088, bpe) == (
        "checkpoint 'x' has vocab 201088, the tokenizer has 1024: set model.tokenizer=o200k_harmony"
    )
    assert (
        vocab_mismatch("c", 1024, o200k)
        == "c has vocab 1024, the tokenizer has 201088: set model.tokenizer=harmonyrl_bpe"
    )
    assert "offers only ['harmonyrl_bpe', 'o200k_harmony']" in str(vocab_mismatch("c", 500, bpe))
    assert tokenizer_for_vocab(77) is None


def test_saved_o200k_loads_with_autotokenizer_and_encodes_like_the_codec(o200k_folder: Path) -> None:
    o200k = O200kCodec()
    hf = AutoTokenizer.from_pretrained(o200k_folder)
    assert len(hf) == 201_088
    assert (hf.eos_token, hf.pad_token, hf.bos_token) == ("<|return|>", "<|endoftext|>", "<|startoftext|>")
    assert hf.eos_token_id == O200K_HARMONY_SPECIALS.return_ and hf.pad_token_id == O200K_HARMONY_SPECIALS.endoftext
    for text in TEXTS:
        assert hf.encode(text, add_special_tokens=False) == o200k.encode(text), text
        ids = o200k.encode(text)
        assert hf.decode(ids) == o200k.decode(ids) == text


def test_saved_o200k_parses_control_tokens_like_the_renderer(o200k_folder: Path) -> None:
    """As a GPT-OSS tokenizer does, the saved one turns control-token text into the renderer's ids, every
    special id (named or reserved) at its place: ``convert_ids_to_tokens`` agrees with openai-harmony's names."""
    o200k = O200kCodec()
    hf = AutoTokenizer.from_pretrained(o200k_folder)
    messages = [system_message(), Message("user", "What is 2 + 2?"), Message("assistant", "4", "final")]
    ids = render_conversation(o200k, messages)
    assert hf.encode(o200k.decode(ids), add_special_tokens=False) == ids
    sp = O200K_HARMONY_SPECIALS
    named = {sp.start: "<|start|>", sp.call: "<|call|>", sp.constrain: "<|constrain|>", 200000: "<|reserved_200000|>"}
    assert {i: hf.convert_ids_to_tokens(i) for i in named} == named
    assert hf.convert_ids_to_tokens(201_087) == "<|reserved_201087|>"
