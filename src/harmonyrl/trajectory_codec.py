"""One plain-data form of a :class:`~harmonyrl.types.Trajectory`, used by every place that stores one.

The replay buffer's checkpoint state, the rollout store's parquet rows and the readable episodes file each
used to spell a trajectory out field by field, and the copies drifted: the replay buffer's dropped
``policy_version``, so a resumed off-policy run trained its old episodes as version 0. Here the fields are read
off the dataclass (:func:`dataclasses.fields`), so a field added to ``Trajectory`` (or ``Turn``, ``Message``)
is carried by every store without touching this module; what needs a shape of its own is named once:

* ``failure`` ↔ ``[kind, detail]`` or ``None``;
* ``turns`` ↔ a list of ``{"sampled": [message, …], "parse_error", "observations": [message, …],
  "generation_s", "tool_s"}``, a message being the dict of all :class:`~harmonyrl.types.Message` fields;
* ``routing`` ↔ its ``[T, L, k]`` tensor (a store that cannot hold tensors turns it into bytes itself);
* tuples ↔ lists; ``reward_terms`` ↔ a dict of floats.

Plain data means numbers, strings, lists, dicts, ``None`` and one tensor: it loads with
``torch.load(weights_only=True)`` and JSON-encodes (routing aside), never pickled classes. Python floats
round-trip bit for bit. Decoding is strict on the fields a record must have and fills a field the record lacks
only from the dataclass's own default (a record written before that field existed): a missing required field or
a value of the wrong type is a ``KeyError`` / ``TypeError`` / ``ValueError`` for the caller to name its file.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch

from harmonyrl.types import Failure, Message, Routing, Trajectory, Turn

Plain = dict[str, Any]
"""A plain-data record (see the module docstring)."""

_MESSAGE_FIELDS = tuple(f.name for f in dataclasses.fields(Message))
_TURN_FIELDS = tuple(f.name for f in dataclasses.fields(Turn))
TRAJECTORY_FIELDS = tuple(f.name for f in dataclasses.fields(Trajectory))
"""Every field a plain trajectory record carries, in declaration order."""


def _default(f: dataclasses.Field[Any]) -> Any:
    """The field's default (its factory called), or ``MISSING`` for a required field."""
    if f.default is not dataclasses.MISSING:
        return f.default
    factory = f.default_factory
    return factory() if callable(factory) else dataclasses.MISSING


_FIELDS = {f.name: f for f in dataclasses.fields(Trajectory)}
_REQUIRED = tuple(name for name, f in _FIELDS.items() if _default(f) is dataclasses.MISSING)
"""Fields a record must have; any other it may lack (written before the field existed) reads as its default, built
afresh for each record (a default dict is never shared between trajectories)."""


def message_to_plain(msg: Message) -> dict[str, str | None]:
    """Every field of ``msg``."""
    return {name: getattr(msg, name) for name in _MESSAGE_FIELDS}


def message_from_plain(d: Mapping[str, Any]) -> Message:
    """The inverse of :func:`message_to_plain`; a field the record lacks is ``None`` (``role`` and ``content``
    are required)."""
    role, content = d["role"], d["content"]
    if not isinstance(role, str) or not isinstance(content, str):
        raise TypeError("a message's role and content must be strings")
    optional = {name: _optional_str(d.get(name), name) for name in _MESSAGE_FIELDS[2:]}
    return Message(role, content, **optional)  # type: ignore[arg-type]  # role: checked as str, a Literal


def turn_to_plain(turn: Turn) -> Plain:
    """``turn`` with its messages as :func:`message_to_plain` dicts."""
    out: Plain = {}
    for name in _TURN_FIELDS:
        value = getattr(turn, name)
        out[name] = [message_to_plain(m) for m in value] if isinstance(value, tuple) else value
    return out


def turn_from_plain(d: Mapping[str, Any]) -> Turn:
    """The inverse of :func:`turn_to_plain`."""
    return Turn(
        sampled=tuple(message_from_plain(m) for m in d["sampled"]),
        parse_error=_optional_str(d["parse_error"], "parse_error"),
        observations=tuple(message_from_plain(m) for m in d["observations"]),
        generation_s=float(d["generation_s"]),
        tool_s=float(d["tool_s"]),
    )


def trajectory_to_plain(t: Trajectory) -> Plain:
    """Every field of ``t`` as plain data (routing as a clone of its tensor)."""
    out: Plain = {}
    for name in TRAJECTORY_FIELDS:
        value = getattr(t, name)
        if name == "failure":
            out[name] = None if value is None else [value.kind, value.detail]
        elif name == "turns":
            out[name] = [turn_to_plain(turn) for turn in value]
        elif name == "routing":
            out[name] = None if value is None else value.ids.clone()
        elif isinstance(value, tuple):
            out[name] = list(value)
        elif isinstance(value, dict):
            out[name] = dict(value)
        else:
            out[name] = value
    return out


def trajectory_from_plain(d: Mapping[str, Any]) -> Trajectory:
    """The inverse of :func:`trajectory_to_plain`: equal to the trajectory that was encoded."""
    missing = [name for name in _REQUIRED if name not in d]
    if missing:
        raise KeyError(f"trajectory record lacks {', '.join(missing)}")
    return Trajectory(**{name: _DECODE[name](d[name]) if name in d else _default(_FIELDS[name]) for name in _DECODE})


def _failure(value: object) -> Failure | None:
    if value is None:
        return None
    if not isinstance(value, list | tuple) or len(value) != 2 or not all(isinstance(x, str) for x in value):
        raise TypeError("failure must be [kind, detail] or None")
    return Failure(value[0], value[1])


def _routing(value: object) -> Routing | None:
    if value is not None and not isinstance(value, torch.Tensor):
        raise TypeError("routing must be a tensor or None")
    return None if value is None else Routing(value)


def _ints(name: str) -> Callable[[Any], tuple[int, ...]]:
    return lambda values: tuple(_int(v, name) for v in values)


_DECODE: dict[str, Callable[[Any], Any]] = {
    "task_id": lambda v: _str(v, "task_id"),
    "group_id": lambda v: _int(v, "group_id"),
    "token_ids": _ints("token_ids"),
    "loss_mask": _ints("loss_mask"),
    "sampler_logprobs": lambda v: tuple(float(x) for x in v),
    "reward": float,
    "terminated": lambda v: _bool(v, "terminated"),
    "truncated": lambda v: _bool(v, "truncated"),
    "failure": _failure,
    "turns": lambda v: tuple(turn_from_plain(turn) for turn in v),
    "parity_mismatches": lambda v: _int(v, "parity_mismatches"),
    "reward_terms": lambda v: {_str(k, "reward_terms"): float(x) for k, x in v.items()},
    "routing": _routing,
    "policy_version": lambda v: _int(v, "policy_version"),
    "task_prompt": lambda v: _str(v, "task_prompt"),
    "expected_answer": lambda v: _str(v, "expected_answer"),
    "token_versions": _ints("token_versions"),
}
"""How each field is read back. Every ``Trajectory`` field must be here (checked at import): a field the codec
did not know would otherwise silently come back as its default."""
if tuple(_DECODE) != TRAJECTORY_FIELDS:  # pragma: no cover - fails at import for whoever adds a field
    raise ImportError(f"trajectory_codec does not decode exactly Trajectory's fields {TRAJECTORY_FIELDS}")


def _str(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string, got {type(value).__name__}")
    return value


def _optional_str(value: object, name: str) -> str | None:
    return None if value is None else _str(value, name)


def _int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}")
    return value


def _bool(value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be true or false, got {type(value).__name__}")
    return value
