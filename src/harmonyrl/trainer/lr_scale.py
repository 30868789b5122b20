"""A learning rate scaled for one update and restored after it (the async pipeline's staleness-aware step,
``rl.async.lr_decay``; the factor is :func:`harmonyrl.algorithms.staleness.staleness_lr_scale`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def scaled_lr(optimizer: torch.optim.Optimizer, scale: float) -> Iterator[None]:
    """Every parameter group's learning rate times ``scale`` inside the block, restored after it (the
    checkpoint keeps the configured rate). ``scale == 1.0`` touches nothing."""
    if scale == 1.0:
        yield
        return
    saved = [group["lr"] for group in optimizer.param_groups]
    for group, lr in zip(optimizer.param_groups, saved, strict=True):
        group["lr"] = lr * scale
    try:
        yield
    finally:
        for group, lr in zip(optimizer.param_groups, saved, strict=True):
            group["lr"] = lr
