"""Dotted keys over a tree of pydantic config models, whatever the schema: overrides parsed (``rl.lr=3e-4``) and
set, YAML trees merged, unknown keys named with the nearest valid one, and a validation error's location written as
the user writes the key. ``harmonyrl.config`` applies them to the run's schema."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any, cast, get_args

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo


class ConfigError(ValueError):
    """A user mistake in the config: the message is one line that names the key."""


def _members(field: FieldInfo) -> tuple[str | None, dict[str, type[BaseModel]]]:
    """The config models a field can hold: ``(None, {"": M})`` for a plain or optional model section,
    ``(discriminator, {tag: M, ...})`` for a discriminated union; empty for scalar fields."""
    discriminator = field.discriminator if isinstance(field.discriminator, str) else None
    stack, found = [field.annotation], []
    while stack:
        ann = stack.pop()
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            found.append(ann)
            continue
        for meta in getattr(ann, "__metadata__", ()):
            if isinstance(meta, FieldInfo) and isinstance(meta.discriminator, str):
                discriminator = meta.discriminator
        stack.extend(get_args(ann))
    if discriminator is None:
        return None, ({"": found[0]} if found else {})
    tags = {}
    for m in found:
        tag = m.model_fields[discriminator].default
        tags[str(tag)] = m
    return discriminator, tags


def _key(name: str, field: FieldInfo) -> str:
    """How the user writes a field: its alias when it has one (``rl.async``, a Python keyword), else its name."""
    return field.alias or name


def _field_named(model: type[BaseModel], key: str) -> tuple[str, FieldInfo] | None:
    """The attribute name and field the user's ``key`` refers to, or None if ``model`` has no such key."""
    for name, field in model.model_fields.items():
        if _key(name, field) == key:
            return name, field
    return None


def _known_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every dotted key ``model``'s schema accepts, sections and their fields, of every kind of a union."""
    keys: list[str] = []
    for name, field in model.model_fields.items():
        keys.append(prefix + _key(name, field))
        for sub in _members(field)[1].values():
            keys.extend(k for k in _known_keys(sub, prefix + _key(name, field) + ".") if k not in keys)
    return keys


def set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    """``tree`` with ``value`` at the dotted key, sections created as needed (ConfigError if a value is in the way)."""
    parts = dotted.split(".")
    node = tree
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"config key '{dotted}': '{part}' is a value, not a section")
        node = child
    node[parts[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """``rl.lr=3e-4`` → ("rl.lr", 3e-4). Values are parsed as YAML scalars (numbers, bools, null)."""
    if "=" not in text:
        raise ConfigError(f"override '{text}' is not of the form key=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override '{text}' has an empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key, value


def _kind_note(model: type[BaseModel]) -> str:
    tags = [f"{name}={f.default!r}" for name, f in model.model_fields.items() if name in ("kind", "mode", "name")]
    return ", ".join(tags) or model.__name__


def check_keys(tree: dict[str, Any], root: type[BaseModel]) -> None:
    """Every key of ``tree`` is one of ``root``'s (an unknown one names the nearest valid key). A union section
    without its discriminator (``rl.advantage`` given only ``std_normalize``) gets the default's, so partial
    overrides of the default choice work: ``tree`` is completed in place."""
    _check_keys(tree, root, "", None, _known_keys(root))


def _check_keys(tree: dict[str, Any], model: type[BaseModel], prefix: str, default: Any, known: list[str]) -> None:
    for key, value in tree.items():
        full = prefix + key
        found = _field_named(model, key)
        if found is None:
            if full in known:  # a field of another kind of this union section
                raise ConfigError(f"config key '{full}' does not apply to the chosen kind ({_kind_note(model)})")
            near = difflib.get_close_matches(full, known, n=1, cutoff=0.6)
            hint = f" (did you mean '{near[0]}'?)" if near else ""
            raise ConfigError(f"unknown config key '{full}'{hint}")
        if not isinstance(value, dict):
            continue
        name, field = found
        discriminator, members = _members(field)
        current = getattr(default, name, None) if default is not None else field.default
        if discriminator is None:
            if members:
                _check_keys(value, members[""], full + ".", current, known)
            continue
        if discriminator not in value and isinstance(current, BaseModel):
            value[discriminator] = getattr(current, discriminator)
        tag = str(value.get(discriminator))
        if discriminator not in value:
            raise ConfigError(f"config section '{full}' needs '{discriminator}' (one of {sorted(members)})")
        if tag not in members:
            raise ConfigError(f"config key '{full}.{discriminator}': '{tag}' is not one of {sorted(members)}")
        same_kind = isinstance(current, members[tag])
        _check_keys(value, members[tag], full + ".", current if same_kind else None, known)


def merge_trees(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``top`` laid over it: mappings merge key by key, anything else in ``top`` replaces."""
    out = dict(base)
    for key, value in top.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = merge_trees(out[key], value) if both else value
    return out


def user_path(loc: tuple[int | str, ...], root: type[BaseModel]) -> list[str]:
    """A pydantic error location as the user writes the key: without the tag pydantic puts after a
    discriminated union (``rollout.engine.local.max_batch`` → ``rollout.engine.max_batch``)."""
    path: list[str] = []
    model: type[BaseModel] | None = root
    parts = [str(p) for p in loc]
    while parts:
        part = parts.pop(0)
        path.append(part)
        field = model.model_fields.get(part) if model is not None else None
        if field is None:
            model = None
            continue
        discriminator, members = _members(field)
        if discriminator is not None and parts and parts[0] in members:
            model = members[parts.pop(0)]
        else:
            model = members.get("")
    return path


def move_keys(tree: dict[str, Any], moves: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """``tree`` with each ``(old, new)`` dotted key of ``moves`` moved to its new place (a value already at the new
    place wins), so a file an earlier version wrote reads as it meant. Sections that are not mappings are left
    alone."""
    for old, new in moves:
        *old_parents, old_leaf = old.split(".")
        source = _section(tree, old_parents)
        if source is None or old_leaf not in source:
            continue
        *new_parents, new_leaf = new.split(".")
        value = source.pop(old_leaf)
        target = _section(tree, new_parents, create=True)
        if target is not None:
            target.setdefault(new_leaf, value)
    return tree


def _section(tree: dict[str, Any], path: Sequence[str], create: bool = False) -> dict[str, Any] | None:
    """The mapping at ``path`` in ``tree`` (made, with ``create``, where absent or null); None if something on
    the way is not a mapping."""
    node: Any = tree
    for key in path:
        if create and node.get(key) is None:
            node[key] = {}
        node = node.get(key)
        if not isinstance(node, dict):
            return None
    return cast(dict[str, Any], node)
