"""The ``sft`` section: the supervised warm start and where its demonstrations come from."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_core import PydanticCustomError

from harmonyrl.envs.loader import TargetError, resolve_target
from harmonyrl.frozen import Frozen


class SFTConfig(Frozen):
    steps: int = Field(500, ge=0)
    """Optimizer steps of supervised warm start on expert demonstrations (0 skips SFT)."""
    batch_size: int = Field(16, ge=1)
    lr: float = Field(1e-3, gt=0)
    """Peak learning rate of the warm start (why 1e-3: docs/tuning.md)."""
    warmup_steps: int = Field(20, ge=0)
    max_grad_norm: float = Field(1.0, gt=0)
    """Gradients are clipped to this total 2-norm before each step (a non-finite loss or norm skips the step)."""
    checkpoint_every: int = Field(50, ge=1)
    """SFT steps between resumable checkpoints (``checkpoints/last``); RL checkpoints after every step."""
    expert: str | None = None
    """Your own expert, ``module:fn`` or ``file.py:fn``: ``fn(task, rng)`` returns the assistant side of a
    demonstration (list of Messages, tool results included); default: the env's scripted expert, whose knobs
    are ``env.p_tool`` / ``env.p_verbose``. A file is recorded with its absolute path."""
    demos: Path | None = None
    """Demonstrations from a file instead of an expert: JSONL, parquet or a datasets folder
    (docs/demonstrations.md); ``sft.steps`` still counts optimizer steps, in seeded epochs over the file."""
    demos_on_mismatch: Literal["drop", "keep", "error"] = "drop"
    """A file demonstration whose recorded tool result differs from the env's own: skip it, train on it as
    recorded, or stop with an error (each one is reported either way)."""

    @field_validator("expert")
    @classmethod
    def _resolve(cls, target: str | None) -> str | None:
        try:
            return None if target is None else resolve_target(target)
        except TargetError as e:  # a custom error: the message reads without pydantic's "Value error, "
            raise PydanticCustomError("target", "{reason}", {"reason": str(e)}) from None
