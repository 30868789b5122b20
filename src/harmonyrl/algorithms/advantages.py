"""Advantage estimators and the value loss: pure functions, tensors in, tensors out.

Shapes: ``B`` episodes, ``T`` tokens. Episode rewards are ``[B]`` (sparse outcome rewards); a group is the
set of episodes sampled for the same task. Token-level estimators (REINFORCE++, GAE, A2C) take ``[B, T]``
tensors and a loss mask; positions with mask 0 — prompt, padding, and tool output *inside* an episode — are
not steps: discounting and bootstrapping jump from one sampled token to the next sampled token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harmonyrl.algorithms.losses import AggregationMode, aggregate_loss


def _group_sums(rewards: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``[B]`` rewards and group ids → (``[B]`` dense group index, ``[G]`` group sizes, ``[G]`` reward sums)."""
    if rewards.shape != group_ids.shape or rewards.dim() != 1:
        raise ValueError(f"rewards {tuple(rewards.shape)} and group_ids {tuple(group_ids.shape)} must be [B]")
    _, inverse = torch.unique(group_ids, return_inverse=True)
    n_groups = int(inverse.max().item()) + 1 if inverse.numel() else 0
    counts = rewards.new_zeros(n_groups).index_add_(0, inverse, torch.ones_like(rewards))
    sums = rewards.new_zeros(n_groups).index_add_(0, inverse, rewards)
    return inverse, counts, sums


def group_relative_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, std_normalize: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """GRPO advantages: each reward minus its group mean, optionally divided by the group std.

    Args:
        rewards: ``[B]`` float episode returns.
        group_ids: ``[B]`` int group index of each episode (any integers; groups need not be contiguous).
        std_normalize: divide by the (unbiased) group std, as GRPO does; ``False`` is Dr.GRPO's choice.
    Returns:
        ``[B]`` advantages. A group of one, or a group with all-equal rewards, gets advantage 0.

    Example (hand-derived): rewards [1, 0, 0, 1, 1, 1], groups [0, 0, 0, 1, 1, 1] → group 0 mean 1/3,
    std sqrt(((2/3)²+2·(1/3)²)/2) = sqrt(1/3) ≈ 0.5774 → [1.1547, -0.5774, -0.5774, 0, 0, 0].
    """
    inverse, counts, sums = _group_sums(rewards, group_ids)
    mean = sums / counts
    centred = rewards - mean[inverse]
    if not std_normalize:
        return centred
    sq = torch.zeros_like(counts).index_add_(0, inverse, centred**2)
    std = torch.sqrt(sq / (counts - 1).clamp(min=1))
    return centred / (std[inverse] + eps)


def broadcast_to_tokens(advantages: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """``[B]`` episode advantages → ``[B, T]`` token advantages, zero where ``loss_mask`` is 0."""
    return advantages[:, None] * loss_mask.to(advantages.dtype)


def dr_grpo_advantages(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """Dr.GRPO advantages ``[B]`` → ``[B]``: ``r_i - mean_group(r)``, no std division (Liu et al. 2025).

    Pair it with a length-independent aggregation (``seq-mean-token-sum-norm``) to remove GRPO's length bias.
    """
    return group_relative_advantages(rewards, group_ids, std_normalize=False)


def rloo_advantages(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """RLOO advantages ``[B]`` → ``[B]``: ``r_i - (Σ_{j≠i in group} r_j) / (n - 1)``; a group of one gets 0.

    Example (hand-derived): rewards [1, 0, 0] in one group → [1 - 0, 0 - 1/2, 0 - 1/2] = [1, -0.5, -0.5].
    """
    inverse, counts, sums = _group_sums(rewards, group_ids)
    n = counts[inverse]
    baseline = (sums[inverse] - rewards) / (n - 1).clamp(min=1)
    return torch.where(n > 1, rewards - baseline, torch.zeros_like(rewards))


def outcome_to_token_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Place each ``[B]`` episode reward on the episode's last masked token → ``[B, T]``.

    A row with no masked token (zero-length response) gets no reward token: its row is all zero.
    """
    m = mask.bool()
    pos = torch.arange(m.shape[1], device=m.device).expand_as(m)
    last = torch.where(m, pos, torch.full_like(pos, -1)).max(dim=1).values
    is_last = (pos == last[:, None]) & m
    return torch.where(is_last, rewards[:, None], torch.zeros((), dtype=rewards.dtype))


def discounted_returns(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """``[B, T]`` → ``[B, T]``: ``G_t = r_t + γ G_{next masked t'}`` over masked tokens; 0 where mask is 0.

    Rewards sitting on masked-out positions are ignored (put them on a sampled token).
    """
    m = mask.bool()
    out = torch.zeros_like(token_rewards)
    carry = torch.zeros_like(token_rewards[:, 0])
    for t in reversed(range(token_rewards.shape[1])):
        carry = torch.where(m[:, t], token_rewards[:, t] + gamma * carry, carry)
        out[:, t] = torch.where(m[:, t], carry, torch.zeros_like(carry))
    return out


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Whiten ``[B, T]`` over all masked tokens of the batch: ``(x - μ) / sqrt(σ² + eps)``, 0 where mask is 0.

    μ and σ² are the (population) mean and variance over masked tokens; no masked token gives all zeros.
    """
    m = mask.to(values.dtype)
    n = m.sum().clamp(min=1.0)
    x = torch.where(m > 0, values, torch.zeros_like(values))
    mean = (x * m).sum(dim=-1).sum() / n  # row sums first: the result does not depend on the thread team
    var = (((x - mean) ** 2) * m).sum(dim=-1).sum() / n
    return (x - mean) * torch.rsqrt(var + eps) * m


def reinforce_pp_advantages(
    rewards: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 1.0,
    group_ids: torch.Tensor | None = None,
    token_rewards: torch.Tensor | None = None,
) -> torch.Tensor:
    """REINFORCE++ (Hu 2025): token-level discounted returns, whitened over the whole batch → ``[B, T]``.

    Args:
        rewards: ``[B]`` outcome rewards, placed on each episode's last masked token.
        mask: ``[B, T]`` loss mask.
        group_ids: ``[B]``; if given, subtract the group-mean reward first (REINFORCE++-baseline).
        token_rewards: optional ``[B, T]`` dense rewards added on top, e.g. a KL penalty.
    ``A_t = whiten(Σ_{k ≥ t, masked} γ^(steps) r_k)`` with μ, σ over all masked tokens of the batch.
    """
    if group_ids is not None:
        rewards = group_relative_advantages(rewards, group_ids, std_normalize=False)
    per_token = outcome_to_token_rewards(rewards, mask)
    if token_rewards is not None:
        per_token = per_token + token_rewards
    return masked_whiten(discounted_returns(per_token, mask, gamma), mask)


def gae_advantages(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
    bootstrap: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over masked tokens. ``[B, T]`` inputs → (advantages, returns) ``[B, T]``.

    For masked ``t`` with next masked token ``t'``: ``δ_t = r_t + γ V_t' - V_t``, ``A_t = δ_t + γλ A_t'``;
    after the last masked token ``V = bootstrap`` (``[B]``, default 0: the episode ended). Returns ``A + V``.
    Both outputs are 0 where mask is 0; values are detached.
    """
    m = mask.bool()
    values = values.detach()
    adv = torch.zeros_like(values)
    next_v = torch.zeros_like(values[:, 0]) if bootstrap is None else bootstrap.detach().to(values.dtype)
    next_adv = torch.zeros_like(values[:, 0])
    for t in reversed(range(values.shape[1])):
        delta = rewards[:, t] + gamma * next_v - values[:, t]
        a = delta + gamma * lam * next_adv
        valid = m[:, t]
        adv[:, t] = torch.where(valid, a, torch.zeros_like(a))
        next_v = torch.where(valid, values[:, t], next_v)
        next_adv = torch.where(valid, a, next_adv)
    returns = torch.where(m, adv + values, torch.zeros_like(adv))
    return adv, returns


def a2c_advantages(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 1.0,
    bootstrap: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A2C one-step advantage with a value baseline: ``A_t = r_t + γ V_t' - V_t`` (GAE with λ = 0).

    ``[B, T]`` inputs → (advantages, TD targets ``r_t + γ V_t'``), both ``[B, T]``, 0 where mask is 0.
    """
    return gae_advantages(rewards, values, mask, gamma=gamma, lam=0.0, bootstrap=bootstrap)


@dataclass(frozen=True)
class ValueLossOutput:
    loss: torch.Tensor
    """Scalar value loss."""
    clip_fraction: torch.Tensor
    """Fraction of masked tokens where the clipped branch gave the larger error."""


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip: float | None = None,
    aggregation: AggregationMode = "token-mean",
    norm: float | None = None,
) -> ValueLossOutput:
    """PPO value loss with optional value clipping. ``[B, T]`` inputs → scalar.

    ``½ max((V - R)², (V_old + clip(V - V_old, -ε, ε) - R)²)``; without ``clip``: ``½ (V - R)²``.
    """
    returns = returns.detach()
    err = (values - returns) ** 2
    if clip is None:
        return ValueLossOutput(aggregate_loss(0.5 * err, mask, aggregation, norm), err.new_zeros(()))
    old_values = old_values.detach()
    clipped_v = old_values + (values - old_values).clamp(-clip, clip)
    err_clipped = (clipped_v - returns) ** 2
    with torch.no_grad():
        m = mask.bool()
        frac = ((err_clipped > err) & m).sum() / m.sum().clamp(min=1)
    loss = aggregate_loss(0.5 * torch.maximum(err, err_clipped), mask, aggregation, norm)
    return ValueLossOutput(loss, frac)
