"""Mixed precision for the trainer: bf16 compute under autocast, fp32 master weights and optimizer state.

Autocast runs matmuls and the attention in bf16 and keeps reductions (softmax, norms, the losses) in fp32; the
parameters, their gradients and AdamW's moments stay fp32, so small updates are not lost to bf16 rounding. The
trainer's log-probs are taken from fp32 logits (``trainer/batch.py``). The on-policy ratio of one epoch and one
minibatch stays exactly 1: old and new log-probs come from the same bf16 forward (docs/memory.md).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Literal

import torch

Precision = Literal["fp32", "bf16"]


def autocast(precision: Precision, device: torch.device) -> AbstractContextManager[object]:
    """The trainer's compute precision as a context: nothing for fp32, bf16 autocast on ``device``'s type."""
    if precision == "fp32":
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
