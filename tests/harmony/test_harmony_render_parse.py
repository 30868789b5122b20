"""Render → parse round trips (property-based), parser robustness and typed errors for malformed turns."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harmonyrl.harmony import (
    HarmonyTokenizer,
    O200kCodec,
    developer_message,
    parse_completion,
    render_completion,
    render_prompt,
    system_message,
)
from harmonyrl.types import Message, ToolSpec

_name = st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True)
_recipient = st.builds(lambda ns, n: f"{ns}.{n}", st.sampled_from(["functions", "browser"]), _name)
_text = st.text(max_size=40)


@st.composite
def _turn(draw: st.DrawFn) -> list[Message]:
    """Zero or more non-terminal messages, then a tool call or a final answer (what one turn can be)."""
    middle = draw(
        st.lists(
            st.builds(
                lambda c, t: Message("assistant", t, c),
                st.sampled_from(["analysis", "commentary"]),
                _text,
            ),
            max_size=3,
        )
    )
    call = st.builds(
        lambda ch, r, ct, t: Message("assistant", t, ch, r, content_type=ct),
        st.sampled_from(["commentary", "analysis"]),
        _recipient,
        st.sampled_from([None, "json", "text"]),
        _text,
    )
    last = draw(st.one_of(st.builds(lambda t: Message("assistant", t, "final"), _text), call))
    return [*middle, last]


@settings(max_examples=150, deadline=None)
@given(turn=_turn(), after_channel=st.booleans())
def test_round_trip(tok: HarmonyTokenizer, turn: list[Message], after_channel: bool) -> None:
    ids = render_completion(tok, turn, recipient_after_channel=after_channel)
    result = parse_completion(tok, ids)
    assert result.error is None, result.error
    assert list(result.messages) == turn


@settings(max_examples=300, deadline=None)
@given(ids=st.lists(st.integers(min_value=-5, max_value=1100), max_size=40), lenient=st.booleans())
def test_parser_never_raises_on_random_ids(tok: HarmonyTokenizer, ids: list[int], lenient: bool) -> None:
    result = parse_completion(tok, ids, lenient=lenient)
    assert result.error is None or 0 <= result.error.position <= len(ids)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_parser_never_raises_on_structured_noise(tok: HarmonyTokenizer, data: st.DataObject) -> None:
    """Random mixes of control ids and text ids reach deep parser states that uniform ids rarely do."""
    sp = tok.special
    pool = [sp.start, sp.end, sp.message, sp.channel, sp.constrain, sp.call, sp.return_, 1, 20, 200, 500]
    pool += tok.encode("assistant to=functions.calculator commentary final analysis json é")
    ids = data.draw(st.lists(st.sampled_from(pool), max_size=30))
    parse_completion(tok, ids)
    parse_completion(tok, ids, lenient=True)


@settings(max_examples=50, deadline=None)
@given(ids=st.lists(st.integers(min_value=0, max_value=201100), max_size=20))
def test_parser_never_raises_o200k(o200k: O200kCodec, ids: list[int]) -> None:
    parse_completion(o200k, ids)


def _c(tok: HarmonyTokenizer, *parts: str | int) -> list[int]:
    """Hand-made ids: strings are encoded as text, ints are used as ids."""
    return [i for p in parts for i in ([p] if isinstance(p, int) else tok.encode(p))]


def _cases(tok: HarmonyTokenizer) -> list[tuple[str, list[int], str]]:
    s = tok.special
    return [
        ("empty", [], "empty"),
        ("no channel", _c(tok, s.message, "hi", s.return_), "missing_channel"),
        ("empty channel", _c(tok, s.channel, s.message, "hi", s.return_), "missing_channel"),
        ("unknown channel", _c(tok, s.channel, "banter", s.message, "hi", s.return_), "unknown_channel"),
        ("junk in header", _c(tok, s.channel, "final junk", s.message, "x", s.return_), "bad_header"),
        (
            "two channels",
            _c(tok, s.channel, "final", s.channel, "final", s.message, "x", s.return_),
            "bad_header",
        ),
        ("no message token", _c(tok, s.channel, "final", s.return_), "missing_message_token"),
        ("cut in header", _c(tok, s.channel, "final"), "unterminated"),
        ("cut in content", _c(tok, s.channel, "final", s.message, "12"), "unterminated"),
        ("ends after end", _c(tok, s.channel, "analysis", s.message, "x", s.end), "unterminated"),
        (
            "bad recipient",
            _c(tok, " to=9bad", s.channel, "commentary", s.message, "{}", s.call),
            "bad_recipient",
        ),
        ("empty recipient", _c(tok, s.channel, "commentary to=", s.message, "{}", s.call), "bad_recipient"),
        (
            "two recipients",
            _c(tok, " to=a.b", s.channel, "commentary to=c.d", s.message, "{}", s.call),
            "bad_recipient",
        ),
        (
            "call without recipient",
            _c(tok, s.channel, "commentary", s.message, "{}", s.call),
            "bad_terminator",
        ),
        ("return on analysis", _c(tok, s.channel, "analysis", s.message, "x", s.return_), "bad_terminator"),
        (
            "tool call ends with end",
            _c(tok, " to=functions.f", s.channel, "commentary", s.message, "{}", s.end),
            "bad_terminator",
        ),
        (
            "start inside content",
            _c(tok, s.channel, "final", s.message, "x", s.start, s.return_),
            "unexpected_token",
        ),
        (
            "no start after end",
            _c(tok, s.channel, "analysis", s.message, "x", s.end, "y"),
            "unexpected_token",
        ),
        (
            "second message not assistant",
            _c(
                tok,
                s.channel,
                "analysis",
                s.message,
                "x",
                s.end,
                s.start,
                "user",
                s.channel,
                "final",
                s.message,
                "y",
                s.return_,
            ),
            "bad_header",
        ),
        ("after return", _c(tok, s.channel, "final", s.message, "x", s.return_, s.start), "trailing_tokens"),
        ("out of range", [tok.special.channel, tok.vocab_size + 3], "unknown_token"),
        (
            "split utf8",
            _c(tok, s.channel, "final", s.message) + tok.encode("é")[:1] + [s.return_],
            "invalid_utf8",
        ),
    ]


def test_malformed_turns_have_typed_errors(tok: HarmonyTokenizer) -> None:
    for name, ids, kind in _cases(tok):
        result = parse_completion(tok, ids)
        assert result.error is not None, name
        assert result.error.kind == kind, (name, result.error)


def test_partial_messages_are_kept_and_lenient_accepts_cut_turns(tok: HarmonyTokenizer) -> None:
    s = tok.special
    ids = _c(
        tok,
        s.channel,
        "analysis",
        s.message,
        "think",
        s.end,
        s.start,
        "assistant",
        s.channel,
        "final",
        s.message,
        "42",
    )
    strict = parse_completion(tok, ids)
    assert strict.error is not None and strict.error.kind == "unterminated"
    assert [m.content for m in strict.messages] == ["think", "42"]
    lenient = parse_completion(tok, ids, lenient=True)
    assert lenient.error is None and lenient.messages[-1] == Message("assistant", "42", "final")


def test_split_utf8_is_replaced_when_lenient(tok: HarmonyTokenizer) -> None:
    s = tok.special
    ids = _c(tok, s.channel, "final", s.message) + tok.encode("é")[:1] + [s.return_]
    assert parse_completion(tok, ids, lenient=True).messages[0].content == "\ufffd"


def test_header_forms() -> None:
    """Both recipient positions parse to the same message; the history form puts it before the channel."""
    tok = HarmonyTokenizer.load_default()
    call = Message("assistant", '{"expression": "1 + 2"}', "commentary", "functions.calculator", content_type="json")
    before = render_completion(tok, [call])
    after = render_completion(tok, [call], recipient_after_channel=True)
    assert (
        tok.decode(before) == " to=functions.calculator<|channel|>commentary <|constrain|>json<|message|>"
        '{"expression": "1 + 2"}<|call|>'
    )
    assert tok.decode(after).startswith("<|channel|>commentary to=functions.calculator <|constrain|>json")
    assert parse_completion(tok, after).messages == parse_completion(tok, before).messages == (call,)


def test_prompt_ends_with_start_assistant(tok: HarmonyTokenizer) -> None:
    tool = ToolSpec("calculator", "Evaluate.", {"type": "object", "properties": {"expression": {"type": "string"}}})
    msgs = [
        system_message(function_tools=True),
        developer_message("Use it.", [tool]),
        Message("user", "1+1?"),
    ]
    ids = render_prompt(tok, msgs)
    assert ids[-2:] == [tok.special.start, *tok.encode("assistant")]
    assert "type calculator = (_: {\nexpression?: string,\n}) => any;" in tok.decode(ids)


def test_render_rejects_non_assistant_completion(tok: HarmonyTokenizer) -> None:
    with pytest.raises(ValueError):
        render_completion(tok, [Message("user", "hi")])
