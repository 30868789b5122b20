"""MoE routing diagnostics, logged every RL step under ``routing/``.

Shapes: ``N`` token positions (a batch flattened), ``L`` MoE layers, ``k`` experts per token, ``E`` experts.
Expert ids are ints with ``-1`` for "not recorded" (see :data:`harmonyrl.models.moe_routing.NOT_ROUTED`);
``valid`` ``[N]`` selects real tokens. Pure functions, no model.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def routing_agreement(a: torch.Tensor, b: torch.Tensor, valid: torch.Tensor) -> float:
    """Fraction of token-layer pairs whose top-k expert *sets* agree (order within the k is ignored).

    ``a``, ``b``: ``[N, L, k]`` expert ids; ``valid``: ``[N]`` bool. A pair counts only if the token is valid
    and both sides recorded it (no ``-1``). No countable pair gives 1.0 (nothing disagrees).
    """
    if a.shape != b.shape:
        raise ValueError(f"routing shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}")
    counted = valid.bool()[:, None] & (a >= 0).all(-1) & (b >= 0).all(-1)  # [N, L]
    if not bool(counted.any()):
        return 1.0
    same = (a.sort(-1).values == b.sort(-1).values).all(-1)  # [N, L]
    return float(same[counted].double().mean())


def expert_load(ids: torch.Tensor, valid: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Share of the routed token-expert assignments each expert got, per layer: ``[L, E]``, rows sum to 1.

    ``ids``: ``[N, L, k]``; ``valid``: ``[N]``. Entries ``-1`` are skipped; a layer with nothing counted is 0.
    """
    n, layers, k = ids.shape
    keep = valid.bool()[:, None, None].expand(n, layers, k) & (ids >= 0)
    onehot = F.one_hot(ids.clamp(min=0).long(), num_experts) * keep[..., None]  # [N, L, k, E]
    counts = onehot.sum(dim=(0, 2)).double()  # [L, E]
    return counts / counts.sum(-1, keepdim=True).clamp(min=1.0)


def load_imbalance(load: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-layer ``max/mean`` load and coefficient of variation ``std/mean`` of ``load`` ``[L, E]``: ``[L]`` each.

    Perfect balance gives (1, 0); everything on one of ``E`` experts gives (E, sqrt(E - 1)) (population std).
    """
    mean = load.mean(-1).clamp(min=1e-12)
    return load.amax(-1) / mean, load.std(-1, correction=0) / mean


def router_aux_loss(logits: torch.Tensor, valid: torch.Tensor, top_k: int) -> float:
    """Switch-Transformer load-balancing loss, as transformers' ``load_balancing_loss_func`` computes it.

    ``logits``: ``[N, L, E]`` router logits; ``valid``: ``[N]``. With ``p = softmax(logits)`` and the top-k of
    ``p`` per token-layer: ``f_e`` = top-k assignments to ``e`` / (valid tokens × layers), ``P_e`` = summed
    ``p_e`` / (valid tokens × layers), loss = ``E · Σ_e f_e P_e``. Uniform routing gives ``k``; the value the
    GPT-OSS config's ``router_aux_loss_coef`` would weight (logged, not added to our loss).
    """
    _, layers, e = logits.shape
    m = valid.to(torch.float64)
    rows = float(m.sum()) * layers
    if rows == 0:
        return 0.0
    probs = torch.softmax(logits.double(), dim=-1)  # [N, L, E]
    top = probs.topk(top_k, dim=-1).indices  # [N, L, k]
    counts = (F.one_hot(top, e).sum(2).double() * m[:, None, None]).sum(dim=(0, 1))  # [E]
    prob_sum = (probs * m[:, None, None]).sum(dim=(0, 1))  # [E]
    return float(e * ((counts / rows) * (prob_sum / rows)).sum())
