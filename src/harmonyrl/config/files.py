"""Reading a run config: YAML files (named presets, ``-c``) and dotted overrides, validated into one
:class:`RunConfig`, every mistake a one-line :class:`ConfigError`; and writing the resolved config back."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from harmonyrl.config.run import RunConfig
from harmonyrl.config_tree import ConfigError, check_keys, merge_trees, move_keys, parse_override, set_dotted, user_path

MOVED_KEYS: tuple[tuple[str, str], ...] = (
    ("sft.p_tool", "env.p_tool"),  # the scripted expert's knobs became the env's own
    ("sft.p_verbose", "env.p_verbose"),
    ("rollout.max_batch", "rollout.engine.max_batch"),  # the engine seam: rollout.engine is a typed union
    ("rollout.engine_dtype", "rollout.engine.dtype"),
    ("rollout.engine_kernel", "rollout.engine.kernel"),
    ("rollout.prefix_cache_mib", "rollout.engine.prefix_cache_mib"),
)
"""Keys a config file written by an earlier harmonyrl may hold (a run's ``config.yaml``, a checkpoint's record),
and where each lives now. Only files are read through this: a key typed on the command line is the user's, and
its error names the new place."""


def _read_tree(path: Path) -> dict[str, Any]:
    """One YAML config file as a tree (ConfigError when it cannot be read or is not a mapping)."""
    if path.is_dir():
        raise ConfigError(f"config file '{path}' is a directory, not a YAML file")
    if not path.is_file():
        raise ConfigError(f"config file '{path}' does not exist")
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError as e:
        raise ConfigError(f"config file '{path}' is not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise ConfigError(f"cannot read config file '{path}': {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config file '{path}' is not valid YAML: {e}".splitlines()[0]) from e
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file '{path}' must hold a mapping at the top level")
    return move_keys(loaded, MOVED_KEYS)


def load_config(
    path: Path | None = None, overrides: list[str] | tuple[str, ...] = (), presets: Sequence[Path] = ()
) -> RunConfig:
    """Load YAML (optional), apply dotted overrides, validate. Raises :class:`ConfigError` on any mistake.
    ``presets``: YAML files of the same schema (named presets, ``-p``) applied in order before ``path``; each
    later file, then each override, replaces the values it names and keeps the rest."""
    tree: dict[str, Any] = {}
    for file in (*presets, *([] if path is None else [path])):
        tree = merge_trees(tree, _read_tree(file))
    for text in overrides:
        key, value = parse_override(text)
        set_dotted(tree, key, value)
    check_keys(tree, RunConfig)
    try:
        return RunConfig.model_validate(tree)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(user_path(err["loc"], RunConfig))
        if not loc:  # a check across sections: its message names the keys, the input is the whole tree
            raise ConfigError(f"config: {err['msg'].removeprefix('Value error, ')}") from e
        raise ConfigError(f"config key '{loc}': {err['msg']} (got {err.get('input')!r})") from e


def dump_config(config: RunConfig) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
