"""Which environment ``harmonyrl eval --checkpoint`` runs: the one the checkpoint was trained on.

A checkpoint records its run config (:mod:`harmonyrl.run.checkpoint_files`; older ones inside a run folder
have the run's ``config.yaml``). ``eval`` uses the recorded ``env`` section. ``env.*`` keys the user sets (as
overrides or in an ``env`` section of ``--config``) are applied on top of it; if that changes anything, eval
refuses with a one-line error naming the key, unless ``--allow-env-mismatch``: a score on an environment the
policy never saw must be asked for, never the silent default. A checkpoint without a record (a plain
transformers folder) is evaluated on the configured env, with a line saying so and why.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import TypeAdapter, ValidationError

from harmonyrl.config import ConfigError, RunConfig, parse_override
from harmonyrl.errors import CheckpointError
from harmonyrl.run.checkpoint_files import read_record
from harmonyrl.tasks.config import EnvConfig

_ENV = "\x00env\x00"
"""Where the env's name goes in :attr:`EvalEnv.template`."""


@dataclass(frozen=True)
class EvalEnv:
    """The config to evaluate with (its ``env`` resolved) and the line that tells the user which env and why."""

    config: RunConfig
    template: str
    """The line, with the env's name left open: a user's env is named by its factory (``units``), as ``train``
    names it, which is known only once the factory is built (:meth:`message_for`)."""

    @property
    def message(self) -> str:
        """The line, naming the env by its config (``env.name``)."""
        return self.message_for(self.config.env.name)

    def message_for(self, env_name: str) -> str:
        return self.template.replace(_ENV, env_name)


def explicit_env(config_file: Path | None, overrides: Sequence[str]) -> dict[str, Any]:
    """The ``env`` keys the user set: the ``env`` section of the YAML file, then ``env.*`` overrides, as a tree.
    (Both were already validated by :func:`harmonyrl.config.load_config`.)"""
    tree: dict[str, Any] = {}
    if config_file is not None and config_file.is_file():
        loaded = yaml.safe_load(config_file.read_text()) or {}
        if isinstance(loaded, dict) and isinstance(loaded.get("env"), dict):
            tree = copy.deepcopy(loaded["env"])
    for text in overrides:
        key, value = parse_override(text)
        parts = key.split(".")
        if parts[0] != "env" or len(parts) < 2:
            continue
        node = tree
        for part in parts[1:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return tree


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _flat(tree: dict[str, Any], prefix: str = "env.") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out |= _flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {prefix + key: value}
    return out


def _validate_env(tree: dict[str, Any]) -> Any:
    try:
        return TypeAdapter(EnvConfig).validate_python(tree)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err["loc"][1:])  # the first part is the union member's tag
        raise ConfigError(f"config key 'env.{loc}': {err['msg']} (got {err.get('input')!r})") from None


def resolve_eval_env(
    config: RunConfig, checkpoint: Path, explicit: dict[str, Any], allow_mismatch: bool = False
) -> EvalEnv:
    """``config`` with the env to evaluate ``checkpoint`` on (see the module docstring). Raises
    :class:`ConfigError` (one line) on a mismatch without ``allow_mismatch`` or an unreadable record, and
    :class:`CheckpointError` when ``checkpoint`` is not a checkpoint folder."""
    if not (checkpoint / "config.json").is_file():  # before any message about its env
        raise CheckpointError(f"'{checkpoint}' is not a checkpoint folder (no config.json inside)")
    record = read_record(checkpoint)
    if record is None:
        origin = "your config" if explicit else "the defaults"
        return EvalEnv(
            config,
            f"evaluating env '{_ENV}' from {origin}: '{checkpoint}' does not record the env it was "
            "trained on (a checkpoint from before harmonyrl recorded it, or a plain transformers folder)",
        )
    trained = record.config.env
    if not explicit:
        message = f"evaluating env '{_ENV}', the env '{checkpoint}' was trained on (from {record.source})"
        return EvalEnv(config.model_copy(update={"env": trained}), message)
    base = trained.model_dump(mode="json")
    same_kind = explicit.get("name", trained.name) == trained.name
    wanted = _validate_env(_merge(base, explicit) if same_kind else config.env.model_dump(mode="json"))
    now, then = _flat(wanted.model_dump(mode="json")), _flat(base)
    differ = [k for k in sorted(now.keys() | then.keys()) if now.get(k) != then.get(k)]
    if not differ:
        message = f"evaluating env '{_ENV}', the env '{checkpoint}' was trained on (from {record.source})"
        return EvalEnv(config.model_copy(update={"env": wanted}), message)
    key = "env.name" if "env.name" in differ else differ[0]
    change = f"{key}={now.get(key)!r}, trained with {then.get(key)!r}"
    more = f" (and {len(differ) - 1} more keys)" if len(differ) > 1 else ""
    if not allow_mismatch:
        raise ConfigError(
            f"'{checkpoint}' was trained on another env: {change}{more}; "
            "drop the env.* settings to evaluate on its own env, or pass --allow-env-mismatch"
        )
    message = f"evaluating env '{_ENV}' although '{checkpoint}' was trained otherwise: {change}{more}"
    return EvalEnv(config.model_copy(update={"env": wanted}), message)
