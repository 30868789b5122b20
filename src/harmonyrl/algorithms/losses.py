"""Policy losses and loss aggregation: pure functions with tensor shapes in the docstrings.

``B`` episodes, ``T`` tokens. ``mask`` is the loss mask (1 on sampled tokens only).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PolicyLossOutput:
    loss: torch.Tensor
    """Scalar loss to minimise."""
    clip_fraction: torch.Tensor
    """Fraction of masked tokens whose ratio was clipped (the clipped branch was active)."""
    ratio_max_dev: torch.Tensor
    """max |ratio - 1| over masked tokens; exactly 0 on the first minibatch of on-policy data."""


def masked_token_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token-mean aggregation: ``sum(values * mask) / max(sum(mask), 1)``. ``[B, T]`` → scalar."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def ppo_clip_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> PolicyLossOutput:
    """PPO clipped surrogate with asymmetric bounds (clip-higher), token-mean aggregated.

    Args:
        logp: ``[B, T]`` log-probs of sampled tokens under the current policy (requires grad).
        old_logp: ``[B, T]`` log-probs under the policy that the advantages refer to (no grad).
        advantages: ``[B, T]`` per-token advantages.
        mask: ``[B, T]`` loss mask.
    Per token: ``-min(ρ A, clip(ρ, 1 - clip_low, 1 + clip_high) A)`` with ``ρ = exp(logp - old_logp)``.

    Example (hand-derived): ρ = 1.5, A = 1, bounds [0.8, 1.28] → -min(1.5, 1.28) = -1.28 (clipped);
    ρ = 0.5, A = 1 → -min(0.5, 0.8) = -0.5 (not clipped: the pessimistic branch is the unclipped one).
    """
    ratio = torch.exp(logp - old_logp)
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    unclipped_obj = ratio * advantages
    clipped_obj = clipped * advantages
    per_token = -torch.minimum(unclipped_obj, clipped_obj)
    with torch.no_grad():
        m = mask.bool()
        was_clipped = (clipped_obj < unclipped_obj) & m
        clip_fraction = was_clipped.sum() / m.sum().clamp(min=1)
        dev = (ratio - 1.0).abs()[m]
        ratio_max_dev = dev.max() if dev.numel() else torch.zeros(())
    return PolicyLossOutput(masked_token_mean(per_token, mask), clip_fraction, ratio_max_dev)
