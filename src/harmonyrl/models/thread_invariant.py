"""A softmax whose gradient does not depend on how many threads compute it.

torch's fused CPU softmax backward (``aten._softmax_backward_data``) splits its row reduction differently for
different OpenMP thread counts, so the same step gives gradients that differ in the last bits with 1 or 2 threads
(measured 2026-11-25 on the micro model: the only thread-count-dependent operation in a whole forward + backward, found
by hashing every op's output under a dispatch mode; docs/contention.md). Those bits grow into different runs.
Here the forward is torch's own softmax, and the backward is written with elementwise ops and one last-dim sum,
which torch reduces row by row whatever the thread count: ``dx = p · (g − Σ_j g_j p_j)``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd.function import once_differentiable


class _Softmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        p = torch.softmax(x, dim=-1)
        ctx.save_for_backward(p)
        return p

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        p: torch.Tensor = ctx.saved_tensors[0]
        out = grad * p
        return out.addcmul_(p, out.sum(dim=-1, keepdim=True), value=-1.0)  # p·g − p·Σ(g·p), one temporary


def softmax_last_dim(x: torch.Tensor) -> torch.Tensor:
    """``softmax(x, dim=-1)``, ``[..., N]`` → ``[..., N]``: the forward is bit-identical to ``torch.softmax``; the
    backward equals torch's within rounding and is the same for every thread count."""
    out: torch.Tensor = _Softmax.apply(x)  # type: ignore[no-untyped-call]
    return out
