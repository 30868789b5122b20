"""The preference-pair format: TRL's ``{prompt, chosen, rejected}``, plain text or conversational, optional ``margin``.

One pair per row (docs/rewards.md)::

    {"prompt": "Describe the sea.", "chosen": "The sea ...", "rejected": "Sea.", "margin": 1.0}
    {"prompt": [{"role": "user", "content": "Describe the sea."}],
     "chosen": [{"role": "assistant", "content": "The sea ..."}],
     "rejected": [{"role": "assistant", "content": "Sea."}]}

Plain text: ``prompt`` is the user's message, ``chosen`` / ``rejected`` the assistant's answer. Conversational: lists of
``{"role", "content"}`` messages (optionally ``channel``); the prompt's roles are system / developer / user /
assistant / tool, the answers' are assistant only, and an answer's last message goes on the ``final`` channel unless
it names another. ``margin`` (a finite number, default 0) is how much better the chosen answer is said to be. Other
keys are ignored (the generator writes ``chosen_met`` / ``rejected_met``). TRL's "implicit prompt" rows (no
``prompt`` key) are reported as missing ``prompt``.

A row that breaks the format is a :class:`PairIssue` (never an exception): identical answers, a missing or
mistyped field, an unknown role, a non-finite margin.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from harmonyrl.types import CHANNELS, Message, Role

PROMPT_ROLES: tuple[Role, ...] = ("system", "developer", "user", "assistant", "tool")


@dataclass(frozen=True)
class Pair:
    """One comparison: the answer ``chosen`` is preferred to ``rejected`` after ``prompt``, by at least ``margin``."""

    prompt: tuple[Message, ...]
    chosen: tuple[Message, ...]
    rejected: tuple[Message, ...]
    margin: float = 0.0


class PairFormatError(ValueError):
    """A row that is not a preference pair; the message says why in a few words."""


def _messages(value: object, field: str, answer: bool) -> tuple[Message, ...]:
    if isinstance(value, str):
        if answer:
            return (Message(role="assistant", channel="final", content=value),)
        return (Message(role="user", content=value),)
    if not isinstance(value, list) or not value:
        raise PairFormatError(f"'{field}' must be a string or a non-empty list of messages")
    out: list[Message] = []
    for i, item in enumerate(value):
        if not isinstance(item, dict) or not isinstance(item.get("content"), str):
            raise PairFormatError(f"'{field}[{i}]' must be an object with a string 'content'")
        channel = item.get("channel")
        allowed: tuple[Role, ...] = ("assistant",) if answer else PROMPT_ROLES
        role = next((r for r in allowed if r == item.get("role")), None)
        if role is None:
            raise PairFormatError(f"'{field}[{i}]' role {item.get('role')!r} is not one of {list(allowed)}")
        if channel is not None and channel not in CHANNELS:
            raise PairFormatError(f"'{field}[{i}]' channel {channel!r} is not one of {list(CHANNELS)}")
        if answer and channel is None:
            channel = "final" if i == len(value) - 1 else "analysis"
        out.append(Message(role=role, content=item["content"], channel=channel))
    return tuple(out)


def parse_pair(row: object) -> Pair:
    """The pair in one row; :class:`PairFormatError` if the row breaks the format (module docstring)."""
    if not isinstance(row, dict):
        raise PairFormatError(f"expected an object, got {type(row).__name__}")
    missing = [k for k in ("prompt", "chosen", "rejected") if row.get(k) is None]
    if missing:
        raise PairFormatError(f"missing {', '.join(repr(k) for k in missing)}")
    margin = row.get("margin", 0.0)
    if margin is None:
        margin = 0.0
    if isinstance(margin, bool) or not isinstance(margin, int | float) or not math.isfinite(margin):
        raise PairFormatError(f"'margin' must be a finite number, got {margin!r}")
    pair = Pair(
        _messages(row["prompt"], "prompt", answer=False),
        _messages(row["chosen"], "chosen", answer=True),
        _messages(row["rejected"], "rejected", answer=True),
        float(margin),
    )
    if pair.chosen == pair.rejected:
        raise PairFormatError("chosen and rejected are identical")
    return pair


def text_pair(prompt: str, chosen: str, rejected: str, margin: float = 0.0) -> Pair:
    """A plain-text pair (what the generator writes), validated like a file row."""
    return parse_pair({"prompt": prompt, "chosen": chosen, "rejected": rejected, "margin": margin})
