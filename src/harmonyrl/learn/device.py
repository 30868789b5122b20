"""Where the trainer's tensors live and in what precision: ``device=auto|cpu|cuda`` resolved once, batches moved
there, and the compute precision.

**Precision.** Mixed precision for the trainer: bf16 compute under autocast, fp32 for every weight that trains.

Autocast runs matmuls and the attention in bf16 and keeps reductions (softmax, norms, the losses) in fp32. What
trains stays fp32 with fp32 gradients and AdamW moments, so small updates are not lost to bf16 rounding (a step
of 1e-4 on a weight of 1 is below half of bf16's 2^-7 spacing there: it would vanish). What does not train is kept
in bf16 (:func:`base_dtype`): with LoRA that is the whole base (nothing is lost: it never changes; for gpt-oss-20b
42 GB instead of 84). A full fine-tune in bf16 keeps fp32 weights (every one trains). The trainer's log-probs are
taken from fp32 logits (``learn/batch.py``). The on-policy ratio of one epoch and one minibatch stays exactly 1:
old and new log-probs come from the same bf16 forward (docs/memory.md).
"""

from __future__ import annotations

import dataclasses
from contextlib import AbstractContextManager, nullcontext
from typing import Literal, TypeVar

import torch

DeviceName = Literal["auto", "cpu", "cuda"]
Precision = Literal["fp32", "bf16"]
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


def autocast(precision: Precision, device: torch.device) -> AbstractContextManager[object]:
    """The trainer's compute precision as a context: nothing for fp32, bf16 autocast on ``device``'s type."""
    if precision == "fp32":
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def base_dtype(precision: Precision, lora: bool) -> torch.dtype:
    """The dtype the model's frozen base is kept in: bf16 for a LoRA run in bf16 (the adapters stay fp32), else
    fp32 (a full fine-tune's weights all train: fp32 master weights)."""
    return torch.bfloat16 if lora and precision == "bf16" else torch.float32
