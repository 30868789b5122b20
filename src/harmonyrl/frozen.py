"""The base of every config model: unknown keys are errors and instances never change (invariant 6); and the
field check the sections that name a checkpoint share."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    """Pydantic model with ``extra="forbid"`` (a mistyped key is an error), ``frozen=True`` (no mutation after
    validation) and ``validate_default=True`` (defaults are checked like user values)."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


def checkpoint_folder(path: Path | None) -> Path | None:
    """A field validator for checkpoint paths: ``path`` unchanged if it is null or a folder holding a
    ``config.json``, else a one-line ``ValueError``."""
    if path is not None and not (path / "config.json").is_file():
        raise ValueError(f"'{path}' is not a checkpoint folder (no config.json inside)")
    return path
