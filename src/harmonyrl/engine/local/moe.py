"""The GPT-OSS MoE block, two ways, for the embedded engine; both route with the layer's own ``router`` module.

* :func:`sparse_moe` (prefill, many tokens): token-expert pairs grouped by expert, transformers' op order, bit
  for bit the ``mlp`` module.
* :func:`dense_moe` (decode, few tokens): every expert on every token as two plain GEMMs, unrouted experts
  weighted 0; fewer, larger ops where per-op overhead dominates.

Both read de-interleaved gate/up columns (HF interleaves them: gate = even, up = odd), so the SwiGLU reads
contiguous halves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts, GptOssMLP


@dataclass(frozen=True)
class DenseExperts:
    """One layer's experts flattened for :func:`dense_moe`: ``w1`` ``[hidden, E·2I]``, ``b1`` ``[E·2I]`` with
    each expert's gate columns first and up columns second (as :class:`SplitExperts`), ``w2`` ``[E·I, hidden]``,
    ``b2`` ``[E, hidden]``."""

    w1: torch.Tensor
    b1: torch.Tensor
    w2: torch.Tensor
    b2: torch.Tensor

    @staticmethod
    def of(experts: GptOssExperts, split: SplitExperts | None = None) -> DenseExperts:
        """``split``: the same experts' :class:`SplitExperts`, if already built (saves re-ordering them)."""
        e, hidden, two_i = experts.gate_up_proj.shape
        split = SplitExperts.of(experts) if split is None else split
        return DenseExperts(
            w1=split.w1.permute(1, 0, 2).reshape(hidden, e * two_i).contiguous(),
            b1=split.b1.reshape(e * two_i),
            w2=experts.down_proj.detach().reshape(e * two_i // 2, hidden),
            b2=experts.down_proj_bias.detach(),
        )


@dataclass(frozen=True)
class SplitExperts:
    """One layer's experts for :func:`sparse_moe`: ``w1`` ``[E, hidden, 2I]`` with each expert's gate columns
    first and up columns second (HF interleaves them: gate = even, up = odd), ``b1`` ``[E, 2I]`` likewise."""

    w1: torch.Tensor
    b1: torch.Tensor

    @staticmethod
    def of(experts: GptOssExperts) -> SplitExperts:
        two_i, on = experts.gate_up_proj.shape[2], experts.gate_up_proj.device
        order = torch.cat([torch.arange(0, two_i, 2, device=on), torch.arange(1, two_i, 2, device=on)])
        return SplitExperts(
            w1=experts.gate_up_proj.detach()[:, :, order].contiguous(),
            b1=experts.gate_up_proj_bias.detach()[:, order].contiguous(),
        )


def sparse_moe(mlp: GptOssMLP, split: SplitExperts, x: torch.Tensor) -> torch.Tensor:
    """The GPT-OSS MoE block on many tokens ``x`` ``[N, hidden]`` → ``[N, hidden]``, each through its top-k.

    Routing is the layer's own ``router`` module. Token-expert pairs are grouped by expert, each expert runs
    its two GEMMs on its contiguous group (GEMM, then bias, as transformers' grouped-experts path does), and
    each token sums its k weighted outputs in top-k order: the same ops in the same order as the ``mlp``
    module, so the result is its bit for bit (tested), at about half its time on CPU. The gain is the
    de-interleaved gate/up columns (:class:`SplitExperts`): the gate math reads contiguous rows, not every
    other float.
    """
    _, scores, idx = mlp.router(x)  # [N, k] each
    experts, (n, k) = mlp.experts, idx.shape
    order = idx.reshape(-1).argsort(stable=True)  # pair p = token p // k, its (p % k)-th choice
    counts = torch.bincount(idx.reshape(-1), minlength=split.w1.shape[0]).tolist()
    grouped = x[order // k]
    outs, start = [], 0
    for e, count in enumerate(counts):
        if count:
            act = _swiglu(experts, (grouped[start : start + count] @ split.w1[e]).add_(split.b1[e]))
            outs.append((act @ experts.down_proj[e]).add_(experts.down_proj_bias[e]))
            start += count
    weighted = torch.cat(outs) * scores.reshape(-1)[order, None]
    unsorted = torch.empty_like(weighted)
    unsorted[order] = weighted
    return unsorted.view(n, k, -1).sum(dim=1)


def dense_moe(mlp: GptOssMLP, flat: DenseExperts, x: torch.Tensor) -> torch.Tensor:
    """The GPT-OSS MoE block on few tokens ``x`` ``[N, hidden]`` → ``[N, hidden]``, all experts densely.

    Routing comes from the layer's own ``router`` module, so expert choice and weights are the trainer's.
    The expert math is HF's (clamped SwiGLU, biases) over de-interleaved gate/up columns, rewritten as two
    plain GEMMs over all ``E`` experts, non-selected experts weighted 0:
    ``sum_e w_e (act_e @ D_e + b_e) == concat_e(w_e act_e) @ vstack_e(D_e) + w @ b``.
    For a decode step (N = batch) this replaces HF's sort / histc / grouped_mm dispatch (~20 small ops)
    with 2 GEMMs; it costs E/k x the expert FLOPs, so prefill (N large) uses :func:`sparse_moe` instead.
    Results differ from the sparse path only by fp32 summation order (~1e-7).
    """
    _, scores, idx = mlp.router(x)
    n, e, experts = x.shape[0], flat.b2.shape[0], mlp.experts
    # [N, E], 0 for unrouted experts
    weights = torch.zeros(n, e, dtype=x.dtype, device=x.device).scatter_(1, idx, scores)
    act = _swiglu(experts, torch.addmm(flat.b1, x, flat.w1).view(n, e, -1))  # [N, E, I]
    return torch.addmm(weights @ flat.b2, (act * weights[:, :, None]).view(n, -1), flat.w2)


def _swiglu(experts: GptOssExperts, h: torch.Tensor) -> torch.Tensor:
    """HF's clamped SwiGLU (``GptOssExperts._apply_gate``, same ops in the same order) on ``h`` ``[..., 2I]``
    laid out gate columns first, up columns second → ``[..., I]``."""
    half = h.shape[-1] // 2
    gate = h[..., :half].clamp(max=experts.limit)
    up = h[..., half:].clamp(min=-experts.limit, max=experts.limit)
    return (up + 1) * (gate * torch.sigmoid(gate * experts.alpha))
