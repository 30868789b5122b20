"""Where the trainer's tensors live: ``device=auto|cpu|cuda`` resolved once, and batches moved there."""

from __future__ import annotations

import dataclasses
from typing import Literal, TypeVar

import torch

DeviceName = Literal["auto", "cpu", "cuda"]
T = TypeVar("T")


def resolve_device(name: DeviceName) -> torch.device:
    """``auto``: the GPU when torch sees one, else the CPU. ``cuda`` without a GPU is a one-line error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device=cuda, but torch sees no GPU (torch.cuda.is_available() is False); use device=cpu")
    return torch.device(name)


def free_bytes(device: torch.device) -> int | None:
    """Memory free for new tensors on ``device`` now: the GPU's free memory, or the host's ``MemAvailable``;
    None where it cannot be read."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None


def to_device(value: T, device: torch.device) -> T:
    """A frozen dataclass of tensors (a batch) with every tensor field on ``device`` (the same object if all are)."""
    changes = {}
    for f in dataclasses.fields(value):  # type: ignore[arg-type]
        x = getattr(value, f.name)
        if isinstance(x, torch.Tensor) and x.device != device:
            changes[f.name] = x.to(device)
    return dataclasses.replace(value, **changes) if changes else value  # type: ignore[type-var]
