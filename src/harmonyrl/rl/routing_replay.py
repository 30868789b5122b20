"""The trainer's side of MoE routing replay: per-micro-batch overrides, their records, and ``routing/*``.

:func:`harmonyrl.rl.update.rl_update` scores the step's first pass through :class:`MoeRouting` (recording,
or replaying the sampler's routing for R3), joins the records into one :class:`TrainerRouting`, logs
:func:`routing_metrics`, and for R2 / R3 replays in every update pass (see ``RLConfig.routing_replay``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from harmonyrl.algorithms.routing_metrics import expert_load, load_imbalance, router_aux_loss, routing_agreement
from harmonyrl.learn.batch import Batch
from harmonyrl.models.moe_routing import NOT_ROUTED, MoeRouting


@dataclass(frozen=True)
class TrainerRouting:
    """What the trainer's MoE did in the step's first pass, over the batch grid ``[B, T]``: ``own`` and
    ``used`` expert ids ``[B, T, L, k]`` (its top-k; what ran, after any replay), ``logits`` ``[B, T, L, E]``."""

    own: torch.Tensor
    used: torch.Tensor
    logits: torch.Tensor


def mb_routing(model: torch.nn.Module, mb: Batch, replay: bool) -> MoeRouting:
    """The routing override for one micro-batch: replaying ``mb.routing`` if ``replay``, else recording."""
    return MoeRouting(model, (mb.size, mb.input_ids.shape[1]), mb.routing if replay else None)


def join_routing(parts: Sequence[MoeRouting], width: int) -> TrainerRouting:
    """Per-micro-batch records (each trimmed to its own width) → ``[B, width, ...]``, ``-1`` / 0 padded."""

    def pad(t: torch.Tensor, fill: float) -> torch.Tensor:
        return torch.cat([t, t.new_full((t.shape[0], width - t.shape[1], *t.shape[2:]), fill)], dim=1)

    return TrainerRouting(
        own=torch.cat([pad(p.own, NOT_ROUTED) for p in parts]),
        used=torch.cat([pad(p.used, NOT_ROUTED) for p in parts]),
        logits=torch.cat([pad(p.logits, 0.0) for p in parts]),
    )


def routing_metrics(batch: Batch, trainer: TrainerRouting, top_k: int) -> dict[str, float]:
    """``routing/*``: sampler-vs-trainer agreement (experts that ran, and the trainer's own top-k), expert
    load balance (worst layer's max/mean, mean CV over layers) and the Switch aux loss, over real tokens."""
    valid = batch.attention_mask.reshape(-1).bool()
    grid = trainer.used.shape[2:]
    used, own = trainer.used.reshape(-1, *grid), trainer.own.reshape(-1, *grid)
    max_over_mean, cv = load_imbalance(expert_load(used, valid, trainer.logits.shape[-1]))
    metrics = {
        "routing/load_max_over_mean": float(max_over_mean.max()),
        "routing/load_cv": float(cv.mean()),
        "routing/aux_loss": router_aux_loss(trainer.logits.reshape(-1, *trainer.logits.shape[2:]), valid, top_k),
    }
    if batch.routing is not None:
        sampler = batch.routing.reshape(-1, *grid)
        metrics["routing/agreement"] = routing_agreement(sampler, used, valid)
        metrics["routing/agreement_own"] = routing_agreement(sampler, own, valid)
    return metrics
