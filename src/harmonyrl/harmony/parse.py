"""Sampled token ids → harmony messages, with a typed error naming the malformed part.

Whatever ids the model samples give a :class:`ParseResult`, never an exception: the model can sample an id outside
the codec's vocabulary (a model's embedding may be padded past it), a control token where none belongs, a
character split across ids, or stop anywhere. Those are the only failures it can cause, and each is an explicit
:data:`ParseErrorKind`. Anything else that raises (a codec that cannot decode an id of its own vocabulary, ids
that are not ints) is a harness bug and propagates (invariant 8): it must not be scored as the model's fault.

Input is what the model sampled after the prompt's ``<|start|>assistant``: one or more assistant messages,
e.g. ``<|channel|>analysis<|message|>...<|end|><|start|>assistant<|channel|>final<|message|>...<|return|>``.
Parsing works on ids, not on decoded text, so text that merely looks like a control token cannot confuse it.

Strict (default) rules, chosen so that only what :func:`~harmonyrl.harmony.render.render_completion` can
produce parses cleanly — the RL loop scores a malformed turn as a model fault instead of guessing:

* every message has ``<|channel|>`` with a known channel (``missing_channel`` / ``unknown_channel``);
* the header is ``[ to=R]<|channel|>C[ to=R][ <|constrain|>T]`` (``bad_header``, ``bad_recipient``);
  the recipient may sit before or after the channel (openai-harmony renders it before, GPT-OSS
  samples it after);
* a tool call ends with ``<|call|>``, a final answer with ``<|return|>``, others with ``<|end|>``
  (``bad_terminator``); nothing may follow ``<|call|>``/``<|return|>`` (``trailing_tokens``);
* the turn must end with ``<|call|>`` or ``<|return|>`` (``unterminated``): those are the sampler's stop ids.

``lenient=True`` accepts a turn cut off inside content or after ``<|end|>``, a mismatched terminator and
invalid UTF-8 (replaced by U+FFFD). Messages parsed before an error are returned alongside it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from harmonyrl.harmony.tokenizer import Codec
from harmonyrl.types import CHANNELS, Channel, Message

ParseErrorKind = Literal[
    "empty",
    "unknown_token",
    "unexpected_token",
    "missing_message_token",
    "bad_header",
    "missing_channel",
    "unknown_channel",
    "bad_recipient",
    "bad_terminator",
    "invalid_utf8",
    "unterminated",
    "trailing_tokens",
]

_RECIPIENT = re.compile(r"[A-Za-z_][\w\-]*(?:\.[A-Za-z_][\w\-]*)*", re.ASCII)
_CONTENT_TYPE = re.compile(r"[\w.\-/+]+", re.ASCII)


@dataclass(frozen=True)
class ParseError:
    kind: ParseErrorKind
    detail: str
    position: int
    """Index into the parsed ids where the problem was detected."""


@dataclass(frozen=True)
class ParseResult:
    messages: tuple[Message, ...]
    error: ParseError | None

    @property
    def ok(self) -> bool:
        return self.error is None


class _Fail(Exception):
    """Internal control flow only; converted to :class:`ParseError` before returning."""

    def __init__(self, kind: ParseErrorKind, detail: str, position: int) -> None:
        super().__init__(detail)
        self.error = ParseError(kind, detail, position)


def _text(codec: Codec, ids: Sequence[int], pos: int, lenient: bool) -> str:
    """Text of ids that :func:`_find` has checked (in the vocabulary, not control tokens): a decode failure
    here is the codec's bug, not the model's, so it propagates."""
    raw = codec.decode_bytes(ids)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        if lenient:
            return raw.decode("utf-8", errors="replace")
        raise _Fail("invalid_utf8", str(exc), pos) from None


def _split_header(codec: Codec, ids: Sequence[int], start: int, end: int) -> dict[str, tuple[int, int]]:
    """Split header ids [start, end) at ``<|channel|>``/``<|constrain|>`` into role/channel/constrain."""
    sp = codec.special
    spans: dict[str, tuple[int, int]] = {}
    part, part_start = "role", start
    for pos in range(start, end):
        tok = ids[pos]
        nxt = "channel" if tok == sp.channel else "constrain" if tok == sp.constrain else None
        if nxt is None:
            continue
        if nxt in spans or part == nxt or (nxt == "channel" and part == "constrain"):
            raise _Fail("bad_header", f"unexpected {nxt} marker in header", pos)
        spans[part] = (part_start, pos)
        part, part_start = nxt, pos + 1
    spans[part] = (part_start, end)
    return spans


def _recipients(words: list[str], pos: int) -> list[str]:
    out = []
    for word in words:
        if not word.startswith("to="):
            raise _Fail("bad_header", f"unexpected header word {word!r}", pos)
        if not _RECIPIENT.fullmatch(word[3:]):
            raise _Fail("bad_recipient", f"malformed recipient {word[3:]!r}", pos)
        out.append(word[3:])
    return out


def _parse_header(codec: Codec, ids: Sequence[int], start: int, end: int, first: bool) -> Message:
    """Header ids (after ``<|start|>``, before ``<|message|>``) → an empty-content assistant message."""
    spans = _split_header(codec, ids, start, end)
    text = {k: _text(codec, ids[a:b], a, lenient=False) for k, (a, b) in spans.items()}
    role_words = text["role"].split()
    if not first:
        if not role_words or role_words[0] != "assistant":
            raise _Fail("bad_header", f"expected role 'assistant', got {text['role']!r}", start)
        role_words = role_words[1:]
    if "channel" not in text:
        raise _Fail("missing_channel", "header has no <|channel|>", start)
    channel_words = text["channel"].split()
    if not channel_words:
        raise _Fail("missing_channel", "empty channel name", spans["channel"][0])
    if channel_words[0] not in CHANNELS:
        raise _Fail("unknown_channel", f"unknown channel {channel_words[0]!r}", spans["channel"][0])
    recipients = _recipients(role_words, start) + _recipients(channel_words[1:], spans["channel"][0])
    if len(recipients) > 1:
        raise _Fail("bad_recipient", f"several recipients {recipients}", start)
    content_type = None
    if "constrain" in text:
        content_type = text["constrain"]
        if not _CONTENT_TYPE.fullmatch(content_type):
            raise _Fail("bad_header", f"malformed content type {content_type!r}", spans["constrain"][0])
    channel: Channel = channel_words[0]
    recipient = recipients[0] if recipients else None
    return Message("assistant", "", channel=channel, recipient=recipient, content_type=content_type)


def _find(codec: Codec, ids: Sequence[int], pos: int, stops: Sequence[int], where: str) -> int:
    """Index of the first id in ``stops`` at/after ``pos`` (``len(ids)`` if none); rejects other specials."""
    allowed = (codec.special.channel, codec.special.constrain) if where == "header" else ()
    for i in range(pos, len(ids)):
        tok = ids[i]
        if tok in stops:
            return i
        if not 0 <= tok < codec.vocab_size:
            raise _Fail("unknown_token", f"id {tok!r} outside the vocabulary", i)
        if codec.is_special(tok) and tok not in allowed:
            kind: ParseErrorKind = "missing_message_token" if where == "header" else "unexpected_token"
            raise _Fail(kind, f"control token {codec.decode([tok])!r} in {where}", i)
    return len(ids)


def _check_terminator(codec: Codec, msg: Message, term: int, pos: int, lenient: bool) -> None:
    sp = codec.special
    if lenient:
        return
    if msg.recipient is not None and term != sp.call:
        raise _Fail("bad_terminator", "a tool call must end with <|call|>", pos)
    if msg.recipient is None and term == sp.call:
        raise _Fail("bad_terminator", "<|call|> without a recipient", pos)
    if term == sp.return_ and msg.channel != "final":
        raise _Fail("bad_terminator", f"<|return|> ends a {msg.channel} message", pos)
    if term == sp.end and msg.channel == "final" and msg.recipient is None:
        raise _Fail("bad_terminator", "a final answer must end with <|return|>", pos)


def _read_message(codec: Codec, ids: Sequence[int], pos: int, first: bool, lenient: bool) -> tuple[Message, int]:
    """Parse one message starting at ``pos`` (just after ``<|start|>``); returns it and the end index."""
    sp = codec.special
    header_end = _find(codec, ids, pos, (sp.message,), "header")
    if header_end == len(ids):
        raise _Fail("unterminated", "turn ended inside a message header", len(ids))
    msg = _parse_header(codec, ids, pos, header_end, first)
    term_pos = _find(codec, ids, header_end + 1, sp.message_terminators, "content")
    content = _text(codec, ids[header_end + 1 : term_pos], header_end + 1, lenient)
    msg = Message(msg.role, content, msg.channel, msg.recipient, None, msg.content_type)
    if term_pos < len(ids):
        _check_terminator(codec, msg, ids[term_pos], term_pos, lenient)
    return msg, term_pos


def _parse(codec: Codec, ids: Sequence[int], lenient: bool, out: list[Message]) -> None:
    sp = codec.special
    if not ids:
        raise _Fail("empty", "no tokens", 0)
    pos, first = 0, True
    while True:
        msg, term_pos = _read_message(codec, ids, pos, first, lenient)
        if term_pos == len(ids):
            out.append(msg)
            if lenient:
                return
            raise _Fail("unterminated", "turn ended inside message content", len(ids))
        out.append(msg)
        if ids[term_pos] in sp.stop_ids:
            if term_pos + 1 != len(ids):
                raise _Fail("trailing_tokens", "tokens after a stop token", term_pos + 1)
            return
        if term_pos + 1 == len(ids):
            if lenient:
                return
            raise _Fail("unterminated", "turn ended after <|end|> without <|call|>/<|return|>", len(ids))
        if ids[term_pos + 1] != sp.start:
            raise _Fail("unexpected_token", "expected <|start|> after <|end|>", term_pos + 1)
        pos, first = term_pos + 2, False


def parse_completion(codec: Codec, ids: Sequence[int], *, lenient: bool = False) -> ParseResult:
    """Parse one sampled assistant turn; see the module docstring for the rules. Whatever the model sampled
    gives a result; only a harness bug (the codec failing on its own ids, ids that are not ints) raises."""
    out: list[Message] = []
    try:
        _parse(codec, list(ids), lenient, out)
    except _Fail as fail:
        return ParseResult(tuple(out), fail.error)
    return ParseResult(tuple(out), None)
