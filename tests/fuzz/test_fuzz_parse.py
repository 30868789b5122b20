"""Fuzzed parser boundary: whatever ids the model samples, :func:`parse_completion` returns a typed result.

The parser no longer catches every exception (a codec bug must not be scored as the model's ``unknown_token``), so
"never raises" here is a property that can fail. Ids cover the whole vocabulary of both codecs (harmony control
tokens and o200k's reserved ids included) and ids past it (a model's embedding may be padded); the structured cases
take a well-formed turn and break it (drop, insert, swap or cut tokens), which reaches the deep parser states that
uniform noise rarely does. A clean parse must be one the renderer reproduces: re-rendering the parsed messages and
parsing again gives the same messages.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzz_settings import fuzz
from harmonyrl.harmony import HarmonyTokenizer, O200kCodec, ParseResult, parse_completion, render_completion
from harmonyrl.harmony.tokenizer import Codec
from harmonyrl.types import Message


@pytest.fixture(scope="module")
def tok() -> HarmonyTokenizer:
    return HarmonyTokenizer.load_default()


@pytest.fixture(scope="module")
def o200k() -> O200kCodec:
    pytest.importorskip("bpe_openai")
    return O200kCodec()


def _check(codec: Codec, ids: list[int]) -> None:
    """The parser's contract on one sampled turn, strict and lenient."""
    for lenient in (False, True):
        result = parse_completion(codec, ids, lenient=lenient)
        assert isinstance(result, ParseResult)
        if result.error is not None:
            assert 0 <= result.error.position <= len(ids), result.error
            continue
        again = parse_completion(codec, render_completion(codec, result.messages), lenient=lenient)
        assert again.error is None and again.messages == result.messages, (ids, result, again)


def _turn(codec: Codec) -> list[int]:
    """A well-formed turn exercising every header part: analysis, a tool call with a content type, a final."""
    turn = [
        Message("assistant", "think é 12", "analysis"),
        Message("assistant", '{"x": 1}', "commentary", "functions.calc", content_type="json"),
    ]
    return render_completion(codec, turn) + render_completion(codec, [Message("assistant", "42", "final")])


def _controls(codec: Codec) -> list[int]:
    sp = codec.special
    return [sp.start, sp.end, sp.message, sp.channel, sp.constrain, sp.call, sp.return_, sp.endoftext]


@st.composite
def _broken(draw: st.DrawFn, base: list[int], pool: list[int]) -> list[int]:
    """``base`` with 1-4 edits: drop, insert (a control id or text id), replace, or cut at a point."""
    ids = list(base)
    for _ in range(draw(st.integers(1, 4))):
        edit = draw(st.sampled_from(["drop", "insert", "replace", "cut"]))
        at = draw(st.integers(0, len(ids)))
        if edit == "insert":
            ids.insert(at, draw(st.sampled_from(pool)))
        elif ids and at < len(ids):
            if edit == "drop":
                del ids[at]
            elif edit == "replace":
                ids[at] = draw(st.sampled_from(pool))
            else:
                ids = ids[:at]
    return ids


@fuzz(400)
@given(ids=st.lists(st.integers(min_value=-3, max_value=1024 + 8), max_size=48))
def test_any_ids_over_the_whole_bpe_vocab_give_a_typed_result(tok: HarmonyTokenizer, ids: list[int]) -> None:
    _check(tok, ids)


@fuzz(400)
@given(data=st.data())
def test_broken_harmony_turns_give_a_typed_result(tok: HarmonyTokenizer, data: st.DataObject) -> None:
    base = _turn(tok)
    pool = _controls(tok) + base + [0, 15, 16, tok.vocab_size - 1, tok.vocab_size, 5000]
    _check(tok, data.draw(_broken(base, pool)))


@fuzz(150)
@given(data=st.data())
def test_o200k_ids_over_the_whole_vocab_give_a_typed_result(o200k: O200kCodec, data: st.DataObject) -> None:
    """Text ids, the named control ids and o200k's reserved specials (199998..201087), and ids past the vocab."""
    text = st.integers(0, 199_997)
    special = st.integers(199_998, o200k.vocab_size - 1)
    past = st.integers(o200k.vocab_size, o200k.vocab_size + 100)
    one = st.one_of(text, special, past, st.sampled_from(_controls(o200k)))
    _check(o200k, data.draw(st.lists(one, max_size=40)))


@fuzz(150)
@given(data=st.data())
def test_broken_o200k_turns_give_a_typed_result(o200k: O200kCodec, data: st.DataObject) -> None:
    base = _turn(o200k)
    pool = _controls(o200k) + base + [199_998, 200_000, 201_087, 201_088, 0]
    _check(o200k, data.draw(_broken(base, pool)))


def test_every_text_id_of_both_vocabularies_decodes(tok: HarmonyTokenizer, o200k: O200kCodec) -> None:
    """Exhaustive (1,024 and 201,088 ids, ~0.2 s): the parser lets a decode failure propagate (it is the codec's
    bug), so every id the parser hands to ``decode_bytes`` must decode."""
    for codec in (tok, o200k):
        text_ids = [i for i in range(codec.vocab_size) if not codec.is_special(i)]
        assert all(isinstance(codec.decode_bytes([i]), bytes) for i in text_ids)


class _BrokenCodec:
    """A codec whose decoding is broken: a harness bug, which must not come back as the model's parse error."""

    def __init__(self, inner: HarmonyTokenizer) -> None:
        self.inner = inner
        self.special = inner.special
        self.vocab_size = inner.vocab_size

    def decode(self, ids: list[int]) -> str:
        return self.inner.decode(ids)

    def decode_bytes(self, ids: list[int]) -> bytes:
        raise KeyError("codec table is corrupt")

    def is_special(self, token_id: int) -> bool:
        return self.inner.is_special(token_id)

    def encode(self, text: str) -> list[int]:
        return self.inner.encode(text)


def test_a_codec_bug_propagates_instead_of_becoming_the_models_parse_error(tok: HarmonyTokenizer) -> None:
    """Regression: parse.py caught every ``Exception`` and returned it as ``unknown_token``, scoring a harness
    bug as the model's malformed turn (invariant 8)."""
    ids = render_completion(tok, [Message("assistant", "42", "final")])
    with pytest.raises(KeyError, match="codec table is corrupt"):
        parse_completion(_BrokenCodec(tok), ids)


def test_ids_that_are_not_ints_are_a_harness_error(tok: HarmonyTokenizer) -> None:
    """An engine returning something other than int ids is the harness's bug, not an ``unknown_token``."""
    with pytest.raises(TypeError):
        parse_completion(tok, [tok.special.channel, "final"])  # type: ignore[list-item]
