"""The base of every config model: unknown keys are errors and instances never change (invariant 6)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    """Pydantic model with ``extra="forbid"`` (a mistyped key is an error), ``frozen=True`` (no mutation after
    validation) and ``validate_default=True`` (defaults are checked like user values)."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)
