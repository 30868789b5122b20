"""Plain builtin values across a process boundary: a strict, bounded, tagged JSON encoding.

The HumanEval grader runs a submission and the problem's tests in two separate sandboxed processes; what the
submitted function returns crosses between them only as this encoding, and the tests only ever see what
:func:`decode` built from it: fresh objects of exact builtin types, never an object the submission made.

    text = encode_text([1, (2.5, "x"), {b"k": {None}}])
    decode_text(text) == [1, (2.5, "x"), {b"k": {None}}]      # True, and a new object

What is plain: ``None``, ``bool``, ``int``, ``float`` (``nan`` and ``inf`` included), ``complex``, ``str``,
``bytes``, and ``list``, ``tuple``, ``set``, ``frozenset``, ``dict`` of plain values, nested at most
:data:`MAX_DEPTH` deep. Types are compared by identity (``type(v) is int``): a subclass of ``int`` that
equals everything, an object with a faked ``__class__`` or a generator is :class:`NotPlain`. Everything
except ``None``, ``bool`` and ``str`` is a two-element JSON list ``[tag, payload]``:

    ["i", "12"]  ["f", "nan"]  ["c", "1.0", "-2.0"]  ["b", "00ff"]
    ["l", [...]] ["t", [...]] ["s", [...]] ["z", [...]] ["d", [[key, value], ...]]

Set items are written in sorted order of their encoding, so equal arguments always encode to the same text
(the grader compares call arguments by their text).

The module is standard library only and self-contained on purpose: its source is also executed inside the
sandbox (see :mod:`harmonyrl.tasks.humaneval_grader`), in a namespace of its own.
"""

from __future__ import annotations

import json
import re

MAX_DEPTH = 100
"""Deepest nesting of containers accepted (also keeps the recursive coders far from the recursion limit)."""
MAX_INT_DIGITS = 4300
"""Longest ``int`` accepted, in decimal digits (Python's own default ``int``/``str`` conversion bound)."""
_MAX_FLOAT_CHARS = 40
_INT = re.compile(r"-?[0-9]+")
_CONTAINERS = {list: "l", tuple: "t", set: "s", frozenset: "z"}
_BUILDERS = {"l": list, "t": tuple, "s": set, "z": frozenset}


class NotPlain(ValueError):
    """A value (or a text) that is not a plain builtin value in this encoding."""


def encode(value: object, depth: int = 0) -> object:
    """``value`` as JSON-ready data (see the module docstring); raises :class:`NotPlain` for anything else."""
    kind = type(value)
    if value is None or kind is bool or kind is str:
        return value
    if kind is int:
        try:
            digits = str(value)
        except ValueError:  # beyond the interpreter's own int/str conversion bound
            raise NotPlain(f"an int longer than {MAX_INT_DIGITS} digits") from None
        if len(digits) > MAX_INT_DIGITS + 1:  # +1: the sign
            raise NotPlain(f"an int longer than {MAX_INT_DIGITS} digits")
        return ["i", digits]
    if kind is float:
        return ["f", repr(value)]
    if kind is complex:
        return ["c", repr(value.real), repr(value.imag)]  # type: ignore[attr-defined]
    if kind is bytes:
        return ["b", value.hex()]  # type: ignore[attr-defined]
    if depth >= MAX_DEPTH:
        raise NotPlain(f"a value nested deeper than {MAX_DEPTH} levels")
    if kind in _CONTAINERS:
        items = [encode(item, depth + 1) for item in value]  # type: ignore[attr-defined]
        if kind is set or kind is frozenset:
            items.sort(key=lambda item: json.dumps(item))
        return [_CONTAINERS[kind], items]  # type: ignore[index]
    if kind is dict:
        return ["d", [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]]  # type: ignore[attr-defined]
    raise NotPlain(f"not a plain builtin value: an object of type {kind.__name__!r}")


def encode_text(value: object) -> str:
    """:func:`encode` as compact JSON text (ASCII only, so no encoding question arises on a pipe)."""
    return json.dumps(encode(value), separators=(",", ":"))


def decode(data: object, depth: int = 0) -> object:
    """The plain value ``data`` (parsed JSON) encodes; raises :class:`NotPlain` for anything malformed."""
    if data is None or type(data) is bool or type(data) is str:
        return data
    if type(data) is not list or len(data) not in (2, 3) or type(data[0]) is not str:
        raise NotPlain(f"malformed value: {str(data)[:60]!r}")
    tag, *payload = data
    if tag == "c" and len(payload) == 2:
        return complex(_float(payload[0]), _float(payload[1]))
    if len(payload) != 1:
        raise NotPlain(f"malformed value with tag {tag!r}")
    [body] = payload
    if tag in ("i", "f", "b"):
        return _atom(tag, body)
    if depth >= MAX_DEPTH:
        raise NotPlain(f"a value nested deeper than {MAX_DEPTH} levels")
    if type(body) is not list:
        raise NotPlain(f"malformed container with tag {tag!r}")
    try:
        if tag in _BUILDERS:
            return _BUILDERS[tag](decode(item, depth + 1) for item in body)
        if tag == "d" and all(type(pair) is list and len(pair) == 2 for pair in body):
            return {decode(k, depth + 1): decode(v, depth + 1) for k, v in body}
    except TypeError as e:  # an unhashable set item or dict key
        raise NotPlain(f"malformed container: {e}") from None
    raise NotPlain(f"unknown or malformed tag {tag!r}")


def _atom(tag: str, body: object) -> object:
    if type(body) is not str:
        raise NotPlain(f"malformed {tag!r} payload")
    if tag == "f":
        return _float(body)
    if tag == "b":
        try:
            return bytes.fromhex(body)
        except ValueError:
            raise NotPlain("malformed bytes") from None
    if len(body) > MAX_INT_DIGITS + 1 or not _INT.fullmatch(body):
        raise NotPlain(f"malformed int: {body[:40]!r}")
    return int(body)


def _float(text: object) -> float:
    if type(text) is not str or len(text) > _MAX_FLOAT_CHARS or not text.isascii():
        raise NotPlain("malformed float")
    try:
        return float(text)
    except ValueError:
        raise NotPlain(f"malformed float: {text!r}") from None


def decode_text(text: str) -> object:
    """:func:`decode` of JSON text; any malformed, non-JSON or too deeply nested input is :class:`NotPlain`."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise NotPlain(f"not JSON: {e}"[:120]) from None
    return decode(data)
