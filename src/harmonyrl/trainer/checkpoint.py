"""Atomic checkpoints: everything is written to a temporary folder, then renamed into place.

A crash mid-write leaves at most a stray ``*.tmp`` folder; the last good checkpoint is never touched
until the new one is complete (invariant 7).
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from typing import Any

import torch

from harmonyrl.models.tiny_gpt_oss import save_model
from harmonyrl.trainer.checkpoint_files import CheckpointFiles


def save_checkpoint(
    path: Path,
    model: Any,
    optimizer: torch.optim.Optimizer | None,
    step: int,
    extra: dict[str, Any],
    files: CheckpointFiles | None = None,
) -> Path:
    """Write ``path`` (a folder) atomically: model safetensors + config, optimizer, RNG states, step, and
    ``files`` (the run's tokenizer and config, see :mod:`.checkpoint_files`) when given."""
    tmp = path.with_name(path.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    save_model(model, tmp)
    if files is not None:
        files.write(tmp)
    state = {
        "step": step,
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "rng_torch": torch.get_rng_state(),
        "rng_python": random.getstate(),
        **extra,
    }
    torch.save(state, tmp / "trainer_state.pt")
    old = path.with_name(path.name + ".old")
    if path.exists():
        os.replace(path, old)
    os.replace(tmp, path)
    if old.exists():
        shutil.rmtree(old)
    return path
