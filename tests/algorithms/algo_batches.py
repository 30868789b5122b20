"""Random small batches for vectorised-vs-loop tests: padding, holes (tool output), empty rows, groups of 1.

Imported by the test modules of this folder (pytest puts the folder on ``sys.path``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

GARBAGE = 7.0
"""Value written at mask-0 positions: a correct function never lets it reach an output."""


@dataclass(frozen=True)
class RandomBatch:
    mask: torch.Tensor  # [B, T] float64 0/1
    logp: torch.Tensor  # [B, T] current policy
    old_logp: torch.Tensor  # [B, T] trainer old policy
    sampler_logp: torch.Tensor  # [B, T] inference engine
    ref_logp: torch.Tensor  # [B, T] reference model
    token_adv: torch.Tensor  # [B, T]
    values: torch.Tensor  # [B, T]
    token_rewards: torch.Tensor  # [B, T]
    rewards: torch.Tensor  # [B]
    group_ids: torch.Tensor  # [B]

    def rows(self) -> list[list[int]]:
        """Masked positions of each row, in order."""
        return [[j for j in range(self.mask.shape[1]) if self.mask[i, j] > 0] for i in range(self.mask.shape[0])]


def _mask(rng: random.Random, b: int, t: int) -> torch.Tensor:
    mask = torch.zeros(b, t, dtype=torch.float64)
    for i in range(b):
        if rng.random() < 0.2:
            continue  # zero-length response
        start = rng.randint(0, t - 1)
        end = rng.randint(start + 1, t)
        for j in range(start, end):
            mask[i, j] = 0.0 if (j > start and rng.random() < 0.25) else 1.0  # holes = tool output
    return mask


def make_batch(seed: int) -> RandomBatch:
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    b, t = rng.randint(1, 6), rng.randint(1, 8)
    mask = _mask(rng, b, t)

    def noisy(base: torch.Tensor, scale: float) -> torch.Tensor:
        out = base + scale * torch.randn(b, t, generator=gen, dtype=torch.float64)
        return torch.where(mask > 0, out, torch.full_like(out, GARBAGE))

    logp = noisy(-torch.rand(b, t, generator=gen, dtype=torch.float64) * 3, 0.0)
    reward_set = [1.0] if rng.random() < 0.2 else [0.0, 0.5, 1.0]  # sometimes all-equal rewards
    return RandomBatch(
        mask=mask,
        logp=logp,
        old_logp=noisy(logp, 0.2),
        sampler_logp=noisy(logp, 0.3),
        ref_logp=noisy(logp, 0.5),
        token_adv=noisy(torch.zeros(b, t, dtype=torch.float64), 1.0),
        values=noisy(torch.zeros(b, t, dtype=torch.float64), 1.0),
        token_rewards=noisy(torch.zeros(b, t, dtype=torch.float64), 0.5),
        rewards=torch.tensor([rng.choice(reward_set) for _ in range(b)], dtype=torch.float64),
        group_ids=torch.tensor([rng.randint(0, max(b // 2, 1)) for _ in range(b)]),
    )


def batch_with_sampled_token(seed: int) -> RandomBatch:
    """``make_batch(seed)``, or the first later seed (step 10 000) whose batch has a sampled token."""
    while not any(make_batch(seed).rows()):
        seed += 10_000
    return make_batch(seed)


def pick_sampled_token(rows: list[list[int]], k: int) -> tuple[int, int]:
    """Deterministically choose one masked token (row, column); ``rows`` must hold at least one."""
    candidates = [(i, pos) for i, pos in enumerate(rows) if pos]
    i, pos = candidates[k % len(candidates)]
    return i, pos[k % len(pos)]
