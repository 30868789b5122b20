"""Token codecs for the harmony format: the project's small BPE tokenizer and the real o200k vocabulary.

Why two codecs: tiny models trained from scratch need a tiny vocabulary (embedding rows dominate a 2 M
parameter model), but the renderer/parser must be provably identical to OpenAI's reference implementation,
which is only checkable against the real ``o200k_harmony`` ids. Both satisfy :class:`Codec`, the only thing
the renderer and parser depend on.

Design points of :class:`HarmonyTokenizer` (HF ``tokenizers`` byte-level BPE):

* every harmony control token is a single id (added as special tokens, trained first so ids are stable);
* digits are split one per token (``Digits(individual_digits=True)`` before ``ByteLevel``) so a tiny model
  copies and compares numbers digit by digit instead of memorising arbitrary digit chunks;
* :meth:`HarmonyTokenizer.encode` never turns user text such as ``"<|call|>"`` into a control token
  (``encode_special_tokens=True``): only the renderer may emit control ids.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

HARMONY_SPECIALS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|startoftext|>",
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|channel|>",
    "<|constrain|>",
    "<|call|>",
    "<|return|>",
    "<|reserved_0|>",
    "<|reserved_1|>",
    "<|reserved_2|>",
    "<|reserved_3|>",
    "<|reserved_4|>",
    "<|reserved_5|>",
    "<|reserved_6|>",
)
"""Special tokens of the project tokenizer, in id order (ids 0..15)."""

DEFAULT_VOCAB_SIZE = 1024
"""Fixed corpus yields ~780 BPE tokens at min_frequency 2; the rest is reserved (see pad_to_size)."""


@dataclass(frozen=True)
class SpecialIds:
    """Ids of the harmony control tokens in one vocabulary."""

    start: int
    end: int
    message: int
    channel: int
    constrain: int
    call: int
    return_: int
    endoftext: int

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """Tokens that end sampling of an assistant turn: ``<|call|>`` and ``<|return|>``."""
        return (self.call, self.return_)

    @property
    def message_terminators(self) -> tuple[int, ...]:
        return (self.end, self.call, self.return_)


class Codec(Protocol):
    """What the harmony renderer and parser need from a vocabulary."""

    @property
    def special(self) -> SpecialIds: ...

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str) -> list[int]:
        """Plain text → ids; control-token look-alikes in ``text`` are encoded as ordinary text."""
        ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        """Raw bytes of non-special ids (may be invalid UTF-8 when a character is split across ids)."""
        ...

    def is_special(self, token_id: int) -> bool: ...


@cache
def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's byte→printable-char table that ``ByteLevel`` uses for token strings."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def build_trainer_pipeline(vocab_size: int = DEFAULT_VOCAB_SIZE) -> tuple[Tokenizer, trainers.BpeTrainer]:
    """Untrained byte-level BPE with individual digits, plus its trainer (for scripts/train_tokenizer.py)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(HARMONY_SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    return tok, trainer


def pad_to_size(tok: Tokenizer, vocab_size: int) -> Tokenizer:
    """Fill the vocabulary up to exactly ``vocab_size`` with reserved special tokens.

    BPE stops early when the corpus has fewer useful merges than requested; padding keeps the vocabulary
    size a fixed, config-friendly number (like GPT-OSS's padded 201088) and leaves room for future control
    tokens without changing any existing id.
    """
    missing = vocab_size - tok.get_vocab_size(with_added_tokens=True)
    if missing > 0:
        start = sum(name.startswith("<|reserved_") for name in HARMONY_SPECIALS)
        tok.add_special_tokens([f"<|reserved_{start + k}|>" for k in range(missing)])
    return tok


class HarmonyTokenizer:
    """The project's byte-level BPE tokenizer (a thin typed wrapper over ``tokenizers.Tokenizer``)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tok = Tokenizer.from_str(tokenizer.to_str())
        self._tok.encode_special_tokens = True  # user text never yields control ids
        found = {name: self._tok.token_to_id(name) for name in HARMONY_SPECIALS[:9]}
        missing = [name for name, i in found.items() if i is None]
        if missing:
            raise ValueError(f"tokenizer lacks harmony special tokens {missing}")
        ids = {name: i for name, i in found.items() if i is not None}
        self.special = SpecialIds(
            start=ids["<|start|>"],
            end=ids["<|end|>"],
            message=ids["<|message|>"],
            channel=ids["<|channel|>"],
            constrain=ids["<|constrain|>"],
            call=ids["<|call|>"],
            return_=ids["<|return|>"],
            endoftext=ids["<|endoftext|>"],
        )
        self._special_ids = frozenset(self._tok.get_added_tokens_decoder())

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        table = _byte_decoder()
        out = bytearray()
        for i in ids:
            piece = self._tok.id_to_token(i)
            if piece is None or i in self._special_ids:
                raise KeyError(f"id {i} is special or out of range")
            out.extend(table[c] for c in piece)
        return bytes(out)

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special_ids

    def to_json(self) -> str:
        """Serialised tokenizer.json; control-token parsing is left on (the HF default) for other tools."""
        tok = Tokenizer.from_str(self._tok.to_str())
        tok.encode_special_tokens = False
        return json.dumps(json.loads(tok.to_str()), indent=1, ensure_ascii=False, sort_keys=True) + "\n"

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / "tokenizer.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json(), encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: str | Path) -> HarmonyTokenizer:
        """Load from a ``tokenizer.json`` file or a directory holding one."""
        p = Path(path)
        if p.is_dir():
            p = p / "tokenizer.json"
        return cls(Tokenizer.from_file(str(p)))

    @classmethod
    def load_default(cls) -> HarmonyTokenizer:
        """The tokenizer shipped with the package (``harmonyrl/data/tokenizer.json``)."""
        text = resources.files("harmonyrl").joinpath("data/tokenizer.json").read_text(encoding="utf-8")
        return cls(Tokenizer.from_str(text))

    def to_transformers(self) -> PreTrainedTokenizerFast:
        """A ``transformers`` tokenizer over this vocabulary (eos ``<|return|>``, pad ``<|endoftext|>``)."""
        from transformers import PreTrainedTokenizerFast

        tok = Tokenizer.from_str(self.to_json())
        return PreTrainedTokenizerFast(
            tokenizer_object=tok,
            bos_token="<|startoftext|>",
            eos_token="<|return|>",
            pad_token="<|endoftext|>",
            unk_token=None,
            additional_special_tokens=[t for t in HARMONY_SPECIALS if t not in _NAMED],
            clean_up_tokenization_spaces=False,
        )

    def save_pretrained(self, directory: str | Path) -> Path:
        """Save in transformers' layout, so ``AutoTokenizer.from_pretrained(directory)`` loads it.

        Writes ``tokenizer.json`` and ``tokenizer_config.json`` (what transformers 5 reads) and
        ``special_tokens_map.json`` (what older tools read). The loaded tokenizer parses control tokens in text:
        ``"<|start|>user<|message|>hi<|end|>"`` gives the same ids as the harmony renderer."""
        folder = Path(directory)
        hf = self.to_transformers()
        hf.save_pretrained(folder)
        named = {"bos_token": hf.bos_token, "eos_token": hf.eos_token, "pad_token": hf.pad_token}
        extra = [t for t in HARMONY_SPECIALS if t not in _NAMED]
        mapping = {**named, "additional_special_tokens": extra}
        (folder / "special_tokens_map.json").write_text(json.dumps(mapping, indent=2) + "\n", encoding="utf-8")
        return folder


_NAMED = frozenset({"<|startoftext|>", "<|return|>", "<|endoftext|>"})

O200K_HARMONY_SPECIALS = SpecialIds(
    start=200006,
    end=200007,
    message=200008,
    channel=200005,
    constrain=200003,
    call=200012,
    return_=200002,
    endoftext=199999,
)
"""Control-token ids of ``o200k_harmony`` (checked against openai-harmony in tests/harmony)."""

O200K_SPECIAL_TEXT: dict[int, str] = {
    199998: "<|startoftext|>",
    199999: "<|endoftext|>",
    200002: "<|return|>",
    200003: "<|constrain|>",
    200005: "<|channel|>",
    200006: "<|start|>",
    200007: "<|end|>",
    200008: "<|message|>",
    200012: "<|call|>",
}
"""The named control tokens of ``o200k_harmony``; openai-harmony decodes every other id ≥ 199998 as
``<|reserved_{id}|>``."""


class O200kCodec:
    """The real GPT-OSS vocabulary: o200k_base from ``bpe_openai`` plus the o200k_harmony control ids.

    The vocabulary of ``model.tokenizer=o200k_harmony`` (see :mod:`harmonyrl.harmony.codecs`): id-for-id parity
    with openai-harmony is tested, and real GPT-OSS checkpoints use it. ``o200k_harmony`` reserves
    199998..201087 for special tokens (201,088 ids, GPT-OSS's ``vocab_size``); only the named ones are known here.
    """

    special = O200K_HARMONY_SPECIALS
    vocab_size = 201088

    def __init__(self) -> None:
        self.require_package()
        import bpe_openai

        self._enc = bpe_openai.get_encoding("o200k_base")

    @staticmethod
    def require_package() -> None:
        """A one-line :class:`ImportError` naming the extra to install when ``bpe-openai`` is missing."""
        import importlib.util

        if importlib.util.find_spec("bpe_openai") is None:
            raise ImportError(
                "model.tokenizer=o200k_harmony needs the 'bpe-openai' package: pip install 'harmonyrl[o200k]'"
            )

    def encode(self, text: str) -> list[int]:
        return list(self._enc.encode_ordinary(text))

    def decode(self, ids: Sequence[int]) -> str:
        parts: list[str] = []
        run: list[int] = []
        for i in ids:
            if i in O200K_SPECIAL_TEXT or i >= 199998:
                parts.append(self._enc.decode(run))
                run = []
                parts.append(O200K_SPECIAL_TEXT.get(i, f"<|reserved_{i}|>"))
            else:
                run.append(i)
        parts.append(self._enc.decode(run))
        return "".join(parts)

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        if any(self.is_special(i) or i < 0 for i in ids):
            raise KeyError("special or negative id in decode_bytes")
        data: bytes = self._enc.decode_bytes(list(ids))
        return data

    def is_special(self, token_id: int) -> bool:
        return token_id >= 199998
