"""From trajectories to padded tensors, and scoring token ids with the trainer's model.

Position convention: logits at position ``t`` predict token ``t + 1``, so every per-token tensor here is
already shifted — index ``t`` refers to token ``ids[:, t + 1]``. Width is ``T - 1`` for padded length ``T``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from harmonyrl.types import Trajectory


@dataclass(frozen=True)
class Batch:
    """Padded training batch. ``B`` episodes, ``T`` padded length.

    input_ids: ``[B, T]`` long; attention_mask: ``[B, T]`` (1 on real tokens);
    loss_mask, sampler_logprobs: ``[B, T-1]`` aligned with the *targets* ``input_ids[:, 1:]``;
    rewards: ``[B]``; group_ids: ``[B]`` long.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    sampler_logprobs: torch.Tensor
    rewards: torch.Tensor
    group_ids: torch.Tensor

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    def select(self, idx: torch.Tensor) -> Batch:
        return Batch(
            *(
                t[idx]
                for t in (
                    self.input_ids,
                    self.attention_mask,
                    self.loss_mask,
                    self.sampler_logprobs,
                    self.rewards,
                    self.group_ids,
                )
            )
        )


def collate(trajectories: Sequence[Trajectory], pad_id: int) -> Batch:
    """Right-pad trajectories. Environment-failed episodes get an all-zero loss mask (never trained on)."""
    if not trajectories:
        raise ValueError("cannot build a batch from zero trajectories")
    width = max(len(t.token_ids) for t in trajectories)
    n = len(trajectories)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.float32)
    slp = torch.zeros((n, width), dtype=torch.float32)
    for i, t in enumerate(trajectories):
        k = len(t.token_ids)
        ids[i, :k] = torch.tensor(t.token_ids, dtype=torch.long)
        attn[i, :k] = 1
        if t.failure is None:
            mask[i, :k] = torch.tensor(t.loss_mask, dtype=torch.float32)
        slp[i, :k] = torch.tensor(t.sampler_logprobs, dtype=torch.float32)
    return Batch(
        input_ids=ids,
        attention_mask=attn,
        loss_mask=mask[:, 1:],
        sampler_logprobs=slp[:, 1:],
        rewards=torch.tensor([t.reward for t in trajectories], dtype=torch.float32),
        group_ids=torch.tensor([t.group_id for t in trajectories], dtype=torch.long),
    )


@dataclass(frozen=True)
class Scored:
    logprobs: torch.Tensor
    """``[B, T-1]`` log-prob of each target token."""
    entropy: torch.Tensor
    """``[B, T-1]`` entropy of the predictive distribution (carries gradient only if asked for)."""


def score(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, entropy_grad: bool = False
) -> Scored:
    """Trainer log-probs of ``input_ids[:, 1:]`` given their prefixes (one forward pass).

    The entropy is exact (summed over the vocabulary). It needs a gradient only for an entropy bonus: the
    sampled-token surprisal ``-logp`` would not do, since ``E[∇ log π] = 0`` makes its gradient vanish.
    """
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits[:, :-1]
    logp_all = F.log_softmax(logits.float(), dim=-1)
    logprobs = logp_all.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        entropy = -(logp_all.exp() * logp_all).sum(-1)
    return Scored(logprobs, entropy)


def micro_batches(batch: Batch, size: int) -> Iterator[Batch]:
    """Fixed-order slices of ``size`` rows, trimmed to their own longest sequence to save compute."""
    for start in range(0, batch.size, size):
        part = batch.select(torch.arange(start, min(start + size, batch.size)))
        width = int(part.attention_mask.sum(1).max().item())
        yield Batch(
            part.input_ids[:, :width],
            part.attention_mask[:, :width],
            part.loss_mask[:, : width - 1],
            part.sampler_logprobs[:, : width - 1],
            part.rewards,
            part.group_ids,
        )
