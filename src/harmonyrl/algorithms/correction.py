"""Rollout correction for the sampler/trainer gap: importance weights, truncation/masking, rejection.

Tokens are sampled by the engine (``sampler_logp``) but trained on as if drawn from the trainer's old policy
(``trainer_logp``). All functions take ``[B, T]`` ``trainer_logp``, ``sampler_logp`` and ``mask``. With the
per-token log-ratio ``ℓ_t = trainer_logp_t - sampler_logp_t`` (0 outside the mask), the weight levels are
  token:      w_t = exp(ℓ_t)
  sequence:   w_t = exp(Σ_s ℓ_s)              (product of the token ratios, one value per sequence)
  geometric:  w_t = exp(Σ_s ℓ_s / n_tokens)   (geometric mean of the token ratios)
Log-weights are clamped to ±20 so that sequence products stay finite. Shifting ``sampler_logp`` of one token
by ``-log 2`` therefore doubles its token weight and its sequence weight.

Two different ways of dropping tokens, kept apart on purpose:
  * masked IS (``MaskedIS``) sets the *weight* to 0 outside ``[low, high]``: the token still counts in the
    loss denominator (its contribution is zero, as in MIS);
  * rejection (``Rejection``) removes tokens or whole sequences from the *loss mask*: they leave the
    denominator too, as if they had never been sampled.
Configs are frozen pydantic models with ``Literal`` discriminators so that the run config can embed them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Literal

import torch
from pydantic import Field, model_validator

from harmonyrl.algorithms.kl import KLEstimator, kl_estimate
from harmonyrl.frozen import Frozen

WeightLevel = Literal["token", "sequence", "geometric"]
LOG_WEIGHT_CLAMP = 20.0


class TruncatedIS(Frozen):
    """Truncated importance sampling (TIS): ``w ← min(w, high)``."""

    mode: Literal["truncate"] = "truncate"
    level: WeightLevel = "token"
    """Token ratio, sequence product, or geometric mean of the token ratios."""
    high: float = Field(2.0, gt=0)
    """Upper clamp of the weight."""
    normalize: bool = False
    """Divide weights by their mean over the kept tokens of the batch."""


class MaskedIS(Frozen):
    """Masked importance sampling (MIS): ``w ← w · [low ≤ w ≤ high]``."""

    mode: Literal["mask"] = "mask"
    level: WeightLevel = "token"
    """Token ratio, sequence product, or geometric mean of the token ratios."""
    low: float = Field(0.5, ge=0)
    """Weights below this become 0."""
    high: float = Field(2.0, gt=0)
    """Weights above this become 0."""
    normalize: bool = False
    """Divide weights by their mean over the kept tokens of the batch."""

    @model_validator(mode="after")
    def _ordered(self) -> MaskedIS:
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) must be ≤ high ({self.high})")
        return self


ISConfig = Annotated[TruncatedIS | MaskedIS, Field(discriminator="mode")]


class Rejection(Frozen):
    """Reject tokens (or whole sequences) whose sampler/trainer KL estimate is too large."""

    level: Literal["token", "sequence"] = "token"
    """token: drop the token; sequence: drop the sequence if its mean per-token estimate is too large."""
    estimator: KLEstimator = "k3"
    """KL(sampler ‖ trainer) estimator; k1 is signed, so its absolute value is compared."""
    threshold: float = Field(gt=0)
    """Reject when |estimate| > threshold."""


class RolloutCorrectionConfig(Frozen):
    weights: ISConfig | None = None
    """Importance weighting; None trains with weight 1."""
    rejection: Rejection | None = None
    """Rejection sampling by a KL threshold; None keeps every token."""
    bypass: bool = False
    """Use the sampler log-probs as the old policy (no trainer forward pass for old log-probs)."""


@dataclass(frozen=True)
class CorrectionOutput:
    weights: torch.Tensor
    """``[B, T]`` weights to multiply into the per-token loss (0 outside ``loss_mask``)."""
    loss_mask: torch.Tensor
    """``[B, T]`` input mask with rejected tokens/sequences removed."""
    truncated_fraction: torch.Tensor
    """Fraction of masked tokens whose weight was clamped (TIS)."""
    masked_fraction: torch.Tensor
    """Fraction of masked tokens whose weight was set to 0 (MIS)."""
    rejected_token_fraction: torch.Tensor
    """Fraction of masked tokens removed by rejection."""
    rejected_seq_fraction: torch.Tensor
    """Fraction of non-empty sequences removed entirely by rejection."""


def masked_log_ratio(trainer_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``ℓ = trainer_logp - sampler_logp`` on masked tokens, 0 elsewhere. ``[B, T]`` → ``[B, T]``."""
    m = mask.bool()
    return torch.where(m, trainer_logp - sampler_logp, torch.zeros_like(trainer_logp))


def log_importance_weights(
    trainer_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor, level: WeightLevel
) -> torch.Tensor:
    """``[B, T]`` log-weights at ``level`` (token ℓ_t, sequence Σℓ, geometric Σℓ/n), clamped ±20, 0 off-mask."""
    m = mask.bool()
    lr = masked_log_ratio(trainer_logp, sampler_logp, mask).detach()
    if level == "token":
        per_seq = None
    elif level == "sequence":
        per_seq = lr.sum(dim=-1)
    elif level == "geometric":
        per_seq = lr.sum(dim=-1) / m.sum(dim=-1).clamp(min=1).to(lr.dtype)
    else:
        raise ValueError(f"unknown weight level {level!r}")
    out = lr if per_seq is None else per_seq[:, None].expand_as(lr)
    out = out.clamp(-LOG_WEIGHT_CLAMP, LOG_WEIGHT_CLAMP)
    return torch.where(m, out, torch.zeros_like(out))


def importance_weights(
    trainer_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor, level: WeightLevel = "token"
) -> torch.Tensor:
    """Raw importance weights ``π_trainer / π_sampler`` at ``level``: ``[B, T]``, 0 outside the mask."""
    lw = log_importance_weights(trainer_logp, sampler_logp, mask, level)
    return torch.where(mask.bool(), torch.exp(lw), torch.zeros_like(lw))


def rejection_keep_mask(
    trainer_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor, rejection: Rejection
) -> torch.Tensor:
    """``[B, T]`` bool: masked tokens that survive rejection.

    token: keep ``|kl_t| ≤ threshold``; sequence: keep the row if ``|mean_t kl_t| ≤ threshold``, with
    ``kl = estimator(sampler_logp, trainer_logp)`` (KL(sampler ‖ trainer) on tokens the sampler drew).
    """
    m = mask.bool()
    kl = kl_estimate(sampler_logp.detach(), trainer_logp.detach(), rejection.estimator)
    kl = torch.where(m, kl, torch.zeros_like(kl))
    if rejection.level == "token":
        return m & (kl.abs() <= rejection.threshold)
    seq_kl = kl.sum(dim=-1) / m.sum(dim=-1).clamp(min=1).to(kl.dtype)
    return m & (seq_kl.abs() <= rejection.threshold)[:, None]


def _fraction(flags: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    return (flags & valid).sum().to(torch.float32) / valid.sum().clamp(min=1).to(torch.float32)


def _weights(lw: torch.Tensor, cfg: TruncatedIS | MaskedIS) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights, flags) for a config: flags mark truncated (TIS) or zeroed (MIS) tokens."""
    log_high = math.log(cfg.high)
    if isinstance(cfg, TruncatedIS):
        return torch.exp(lw.clamp(max=log_high)), lw > log_high
    log_low = math.log(cfg.low) if cfg.low > 0 else -math.inf
    outside = (lw < log_low) | (lw > log_high)
    return torch.where(outside, torch.zeros_like(lw), torch.exp(lw)), outside


def apply_correction(
    trainer_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor, cfg: RolloutCorrectionConfig
) -> CorrectionOutput:
    """Rejection, then truncated/masked IS weights, then optional batch normalisation. ``[B, T]`` in and out.

    ``weights = keep · f(w)`` with ``f = min(w, high)`` (TIS) or ``w·[low ≤ w ≤ high]`` (MIS); normalised
    weights are divided by ``mean(weights over kept tokens)``. Everything is detached.
    """
    m = mask.bool()
    keep = m if cfg.rejection is None else rejection_keep_mask(trainer_logp, sampler_logp, mask, cfg.rejection)
    zero = torch.zeros((), dtype=torch.float32)
    truncated, masked = zero, zero
    weights = keep.to(trainer_logp.dtype)
    if cfg.weights is not None:
        lw = log_importance_weights(trainer_logp, sampler_logp, mask, cfg.weights.level)
        raw, flags = _weights(lw, cfg.weights)
        if isinstance(cfg.weights, TruncatedIS):
            truncated = _fraction(flags, m)
        else:
            masked = _fraction(flags, m)
        weights = torch.where(keep, raw, torch.zeros_like(raw))
        if cfg.weights.normalize:
            mean_w = weights.sum() / keep.sum().clamp(min=1).to(weights.dtype)
            weights = torch.where(mean_w > 0, weights / mean_w.clamp(min=1e-30), weights)
    rows = m.any(dim=-1)
    return CorrectionOutput(
        weights=weights,
        loss_mask=keep.to(mask.dtype),
        truncated_fraction=truncated,
        masked_fraction=masked,
        rejected_token_fraction=_fraction(m & ~keep, m),
        rejected_seq_fraction=_fraction(rows & ~keep.any(dim=-1), rows),
    )


def resolve_old_logp(
    sampler_logp: torch.Tensor, trainer_old_logp: torch.Tensor | None, cfg: RolloutCorrectionConfig
) -> torch.Tensor:
    """Old-policy log-probs ``[B, T]`` for the PPO ratio: the sampler's in bypass mode, else the trainer's.

    In bypass mode the PPO ratio is ``π_θ / π_sampler`` and its clipping absorbs the mismatch; there is no
    separate trainer forward pass for old log-probs.
    """
    if cfg.bypass:
        return sampler_logp.detach()
    if trainer_old_logp is None:
        raise ValueError("trainer_old_logp is required unless rollout correction runs in bypass mode")
    return trainer_old_logp.detach()
