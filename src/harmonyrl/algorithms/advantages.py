"""Advantage estimators: pure functions, tensors in, tensors out.

Shapes: ``B`` episodes, ``T`` tokens. Rewards are per episode (sparse outcome rewards); a group is the set
of episodes sampled for the same task.
"""

from __future__ import annotations

import torch


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
    if rewards.shape != group_ids.shape or rewards.dim() != 1:
        raise ValueError(f"rewards {tuple(rewards.shape)} and group_ids {tuple(group_ids.shape)} must be [B]")
    _, inverse = torch.unique(group_ids, return_inverse=True)
    n_groups = int(inverse.max().item()) + 1 if inverse.numel() else 0
    counts = torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, inverse, torch.ones_like(rewards))
    sums = torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, inverse, rewards)
    mean = sums / counts
    centred = rewards - mean[inverse]
    if not std_normalize:
        return centred
    sq = torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, inverse, centred**2)
    std = torch.sqrt(sq / (counts - 1).clamp(min=1))
    return centred / (std[inverse] + eps)


def broadcast_to_tokens(advantages: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """``[B]`` episode advantages → ``[B, T]`` token advantages, zero where ``loss_mask`` is 0."""
    return advantages[:, None] * loss_mask.to(advantages.dtype)
