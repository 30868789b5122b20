"""The GPT-OSS MoE block for the embedded engine: each token through its top-k experts only, routed by the layer's
own ``router`` module, reading transformers' own expert tensors (no re-laid-out copy).

:func:`routed_moe` serves prefill and decode alike: token-expert pairs grouped by expert, each expert's two GEMMs
on its group, transformers' op order, bit for bit the ``mlp`` module. It used to have a twin for decode that ran
every expert on every token as two large GEMMs (fewer ops where per-op overhead dominates on a CPU), over its own
flattened copy of the experts, beside a third, de-interleaved copy for prefill: for gpt-oss-20b that held the
experts (~24 GiB in bf16 of its ~26) three times and multiplied decode's expert FLOPs by E/k = 8. Now the experts are
held once, wherever the weights live (the trainer's own tensors when the engine shares them), and only routed
experts run.

HF interleaves gate and up columns (gate = even, up = odd). The GEMM runs on the interleaved weights; its output
``[n, 2I]`` is de-interleaved (one small copy of activations, not of weights), so the SwiGLU reads contiguous
halves. A GEMM's columns do not depend on their order, so this is the same bits as a de-interleaved weight.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts, GptOssMLP


def routed_moe(mlp: GptOssMLP, x: torch.Tensor) -> torch.Tensor:
    """The GPT-OSS MoE block on tokens ``x`` ``[N, hidden]`` → ``[N, hidden]``, each through its top-k.

    Routing is the layer's own ``router`` module. Token-expert pairs are grouped by expert, each expert runs
    its two GEMMs on its contiguous group (GEMM, then bias, as transformers' grouped-experts path does), and
    each token sums its k weighted outputs in top-k order: the same ops in the same order as the ``mlp``
    module, so the result is its bit for bit (tested). Experts no token chose are not touched.
    """
    _, scores, idx = mlp.router(x)  # [N, k] each
    experts, (n, k) = mlp.experts, idx.shape
    order = idx.reshape(-1).argsort(stable=True)  # pair p = token p // k, its (p % k)-th choice
    counts = torch.bincount(idx.reshape(-1), minlength=experts.gate_up_proj.shape[0]).tolist()
    grouped = x[order // k]
    outs, start = [], 0
    for e, count in enumerate(counts):
        if count:
            gate_up = (grouped[start : start + count] @ experts.gate_up_proj[e]).add_(experts.gate_up_proj_bias[e])
            act = _swiglu(experts, gate_up)
            outs.append((act @ experts.down_proj[e]).add_(experts.down_proj_bias[e]))
            start += count
    weighted = torch.cat(outs) * scores.reshape(-1)[order, None]
    unsorted = torch.empty_like(weighted)
    unsorted[order] = weighted
    return unsorted.view(n, k, -1).sum(dim=1)


def _swiglu(experts: GptOssExperts, h: torch.Tensor) -> torch.Tensor:
    """HF's clamped SwiGLU (``GptOssExperts._apply_gate``, same ops in the same order) on ``h`` ``[c, 2I]`` with
    HF's interleaved gate (even) / up (odd) columns → ``[c, I]``."""
    split = h.unflatten(-1, (-1, 2)).transpose(-1, -2).contiguous()  # [c, 2, I]: gate row, up row
    gate = split[:, 0].clamp(max=experts.limit)
    up = split[:, 1].clamp(min=-experts.limit, max=experts.limit)
    out: torch.Tensor = (up + 1) * (gate * torch.sigmoid(gate * experts.alpha))
    return out
