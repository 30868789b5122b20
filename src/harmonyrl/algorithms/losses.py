"""Policy losses and loss aggregation: pure functions with tensor shapes in the docstrings.

``B`` episodes, ``T`` tokens. ``mask`` is the loss mask (1 on sampled tokens only). Each policy loss builds a
``[B, T]`` per-token loss, optionally multiplies it by (detached) rollout-correction weights, and reduces it
with :func:`aggregate_loss`, so the aggregation mode is a separate, testable choice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

AggregationMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def _zero() -> torch.Tensor:
    return torch.zeros(())


@dataclass(frozen=True)
class PolicyLossOutput:
    loss: torch.Tensor
    """Scalar loss to minimise."""
    clip_fraction: torch.Tensor
    """Fraction of masked tokens whose ratio was clipped (the clipped branch was active)."""
    ratio_max_dev: torch.Tensor
    """max |ratio - 1| over masked tokens; exactly 0 on the first minibatch of on-policy data."""
    dual_clip_fraction: torch.Tensor = field(default_factory=_zero)
    """Fraction of masked tokens where the dual-clip bound ``c·A`` (A < 0) was active."""


def masked_token_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token-mean aggregation: ``sum(values * mask) / max(sum(mask), 1)``. ``[B, T]`` → scalar."""
    mask = mask.to(values.dtype)
    return (values * mask).sum(dim=-1).sum() / mask.sum().clamp(min=1.0)


def aggregation_units(mask: torch.Tensor, mode: AggregationMode) -> torch.Tensor:
    """What an aggregation averages over, as a scalar: masked tokens (``token-mean``) or sequences holding at
    least one masked token (``seq-*`` modes). ``[B, T]`` mask → scalar.

    This is the *global normaliser* of a batch that is split into parts (micro-batches, or the shards of a
    distributed update): a part's :func:`aggregate_loss` weighted by ``aggregation_units(part) /
    aggregation_units(whole)`` sums to the whole batch's loss. Example (hand-derived): mask rows
    ``[1, 1, 0]``, ``[0, 0, 0]``, ``[1, 0, 0]`` → 3 tokens, 2 sequences.
    """
    return mask.sum() if mode == "token-mean" else mask.bool().any(-1).sum().to(mask.dtype)


def aggregate_loss(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    mode: AggregationMode = "token-mean",
    norm: float | None = None,
    denominator: float | None = None,
) -> torch.Tensor:
    """Reduce a ``[B, T]`` per-token loss to a scalar.

    With ``S`` = the sequences holding at least one masked token (empty rows do not count):
      token-mean:              Σ_bt l·m / Σ_bt m
      seq-mean-token-sum:      (1/|S|) Σ_b Σ_t l·m
      seq-mean-token-mean:     (1/|S|) Σ_b (Σ_t l·m / Σ_t m)
      seq-mean-token-sum-norm: (1/|S|) Σ_b Σ_t l·m / norm   (norm a constant, e.g. the max response length)
    ``denominator`` overrides Σm (token-mean) or |S| (seq-* modes) so that micro-batches of one optimizer
    step can share the global count. Denominators are clamped to ≥ 1: an all-zero mask gives 0, never NaN.
    """
    m = mask.to(per_token.dtype)
    masked = torch.where(m > 0, per_token, torch.zeros_like(per_token)) * m
    # row sums first: torch splits a single reduction over more than 32,768 elements by the thread team, so its
    # last bits would depend on the thread count; reductions along a dimension do not (harmonyrl/threads.py)
    if mode == "token-mean":
        count = m.sum() if denominator is None else torch.tensor(denominator, dtype=per_token.dtype)
        return masked.sum(dim=-1).sum() / count.clamp(min=1.0)
    tokens = m.sum(dim=-1)
    n_seq = (tokens > 0).sum() if denominator is None else torch.tensor(denominator)
    n_seq = n_seq.to(per_token.dtype).clamp(min=1.0)
    if mode == "seq-mean-token-sum":
        return masked.sum(dim=-1).sum() / n_seq
    if mode == "seq-mean-token-mean":
        return (masked.sum(dim=-1) / tokens.clamp(min=1.0)).sum() / n_seq
    if mode == "seq-mean-token-sum-norm":
        if norm is None or norm <= 0:
            raise ValueError("seq-mean-token-sum-norm needs a positive constant `norm` (e.g. max response length)")
        return masked.sum(dim=-1).sum() / n_seq / norm
    raise ValueError(f"unknown aggregation mode {mode!r}")


def _fraction(flags: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.bool()
    return (flags & m).sum() / m.sum().clamp(min=1)


def _max_abs_dev(ratio: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    dev = (ratio - 1.0).abs()[valid.bool()]
    return dev.max() if dev.numel() else torch.zeros(())


def _weighted(per_token: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    return per_token if weights is None else per_token * weights.detach()


def ppo_clip_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    *,
    dual_clip: float | None = None,
    weights: torch.Tensor | None = None,
    aggregation: AggregationMode = "token-mean",
    norm: float | None = None,
) -> PolicyLossOutput:
    """PPO clipped surrogate with asymmetric bounds (clip-higher) and optional dual-clip.

    Args:
        logp: ``[B, T]`` log-probs of sampled tokens under the current policy (requires grad).
        old_logp: ``[B, T]`` log-probs under the policy that the advantages refer to (no grad).
        advantages: ``[B, T]`` per-token advantages.
        mask: ``[B, T]`` loss mask.
        dual_clip: constant ``c > 1``; for ``A < 0`` the objective is bounded below by ``c·A`` (Ye et al. 2020).
        weights: ``[B, T]`` rollout-correction weights multiplied into the per-token loss (detached).
    Per token: ``-min(ρ A, clip(ρ, 1 - clip_low, 1 + clip_high) A)`` with ``ρ = exp(logp - old_logp)``;
    with dual-clip and ``A < 0``: ``-max(min(ρ A, clip(ρ) A), c A)``.

    Example (hand-derived): ρ = 1.5, A = 1, bounds [0.8, 1.28] → -min(1.5, 1.28) = -1.28 (clipped);
    ρ = 0.5, A = 1 → -min(0.5, 0.8) = -0.5 (not clipped: the pessimistic branch is the unclipped one).
    """
    ratio = torch.exp(logp - old_logp)
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    unclipped_obj = ratio * advantages
    clipped_obj = clipped * advantages
    objective = torch.minimum(unclipped_obj, clipped_obj)
    dual_active = torch.zeros_like(mask, dtype=torch.bool)
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        floor = dual_clip * advantages
        negative = advantages < 0
        dual_active = negative & (objective < floor)
        objective = torch.where(negative, torch.maximum(objective, floor), objective)
    per_token = _weighted(-objective, weights)
    with torch.no_grad():
        clip_fraction = _fraction(clipped_obj < unclipped_obj, mask)
        dual_fraction = _fraction(dual_active, mask)
        ratio_max_dev = _max_abs_dev(ratio, mask)
    loss = aggregate_loss(per_token, mask, aggregation, norm)
    return PolicyLossOutput(loss, clip_fraction, ratio_max_dev, dual_fraction)


def sequence_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO's length-normalised sequence log-ratio ``[B, T]`` → ``[B]``: ``(1/|y|) Σ_t m·(logp - old_logp)``.

    Empty rows give 0 (ratio 1).
    """
    m = mask.bool()
    log_ratio = torch.where(m, logp - old_logp, torch.zeros_like(logp))
    return log_ratio.sum(dim=-1) / m.sum(dim=-1).clamp(min=1).to(logp.dtype)


def gspo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    *,
    weights: torch.Tensor | None = None,
    aggregation: AggregationMode = "seq-mean-token-mean",
    norm: float | None = None,
) -> PolicyLossOutput:
    """GSPO (Zheng et al. 2025), in its GSPO-token form: sequence-level ratio, token-level gradient.

    Args:
        logp, old_logp, advantages, mask: ``[B, T]`` as in :func:`ppo_clip_loss`.
    ``s_i = exp(mean_t m·(logp - old_logp))``; per token ``s_it = sg[s_i] · exp(logp_t - sg[logp_t])`` (value
    ``s_i``, gradient ``s_i ∇logp_t``) and loss ``-min(s_it A_it, clip(s_it, 1 - clip_low, 1 + clip_high) A_it)``.
    With one advantage per sequence and seq-mean-token-mean this equals GSPO's sequence objective, gradient
    included. Clip bounds are those of the paper's scale (e.g. 3e-4 / 4e-4), not PPO's.
    """
    seq_lr = sequence_log_ratio(logp, old_logp, mask).detach()
    log_s_tok = seq_lr[:, None] + logp - logp.detach()
    s_tok = torch.exp(log_s_tok)
    unclipped_obj = s_tok * advantages
    clipped_obj = s_tok.clamp(1.0 - clip_low, 1.0 + clip_high) * advantages
    per_token = _weighted(-torch.minimum(unclipped_obj, clipped_obj), weights)
    with torch.no_grad():
        clip_fraction = _fraction(clipped_obj < unclipped_obj, mask)
        ratio_max_dev = _max_abs_dev(torch.exp(seq_lr), mask.bool().any(dim=-1))
    return PolicyLossOutput(aggregate_loss(per_token, mask, aggregation, norm), clip_fraction, ratio_max_dev)


def policy_gradient_loss(
    logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    weights: torch.Tensor | None = None,
    aggregation: AggregationMode = "token-mean",
    norm: float | None = None,
) -> PolicyLossOutput:
    """Plain policy gradient (REINFORCE): per token ``-A · logp``. ``[B, T]`` inputs → scalar loss.

    No ratio, so ``clip_fraction`` and ``ratio_max_dev`` are 0.
    """
    per_token = _weighted(-advantages * logp, weights)
    loss = aggregate_loss(per_token, mask, aggregation, norm)
    return PolicyLossOutput(loss, torch.zeros(()), torch.zeros(()))


def entropy_bonus(
    entropy: torch.Tensor,
    mask: torch.Tensor,
    coef: float,
    aggregation: AggregationMode = "token-mean",
    norm: float | None = None,
) -> torch.Tensor:
    """Loss term rewarding entropy: ``-coef · agg(H)`` for ``[B, T]`` per-token entropy ``H`` → scalar.

    Add it to the policy loss; with ``coef > 0`` minimising it raises entropy.
    """
    return -coef * aggregate_loss(entropy, mask, aggregation, norm)
