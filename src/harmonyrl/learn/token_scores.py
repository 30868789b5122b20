"""Log-probs and entropies of target tokens, from logits in one piece or from hidden states chunk by chunk.

Why chunks: the logits of a batch are ``[B, T, V]``. With the shipped 1,024-id vocabulary an SFT batch's are
16 MiB; with o200k_harmony's 201,088 ids they are 3.3 GB (16 × 256 × 201,088 fp32), and ``log_softmax``, its
``exp`` for the entropy and autograd's saved copies multiply that. :func:`chunked_token_scores` applies the LM
head to ``chunk`` positions at a time and recomputes each chunk's logits in the backward pass
(``torch.utils.checkpoint``), so at most one chunk's ``[B, chunk, V]`` exists at any moment. Every row's
log-softmax is computed over its own logits either way, so the chunked result equals the one-piece result
within fp32 rounding of the head's matmul (a test compares them).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

LOGITS_BUDGET = 1 << 25
"""Most logits elements (128 MiB in fp32) scored in one piece; above it :func:`score` goes chunk by chunk. The
default vocabulary stays below it (16 × 256 × 1,024 = 4 M), so its results are unchanged bit for bit."""


def token_scores(logits: torch.Tensor, targets: torch.Tensor, entropy_grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, N, V]`` logits and ``[B, N]`` target ids → (``[B, N]`` log-probs of the targets, ``[B, N]`` entropies).

    The entropy is exact (summed over the vocabulary) and carries a gradient only with ``entropy_grad``."""
    logp_all = F.log_softmax(logits.float(), dim=-1)
    logprobs = logp_all.gather(-1, targets[..., None]).squeeze(-1)
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logprobs, entropy


def _head_scores(
    head: torch.nn.Module, entropy_grad: bool, states: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    return token_scores(head(states), targets, entropy_grad)


def chunk_positions(rows: int, vocab: int, budget: int = LOGITS_BUDGET) -> int:
    """Positions per chunk so that one chunk's ``[rows, chunk, vocab]`` logits stay within ``budget`` elements."""
    return max(1, budget // max(1, rows * vocab))


def chunked_token_scores(
    head: torch.nn.Module, states: torch.Tensor, targets: torch.Tensor, entropy_grad: bool, chunk: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`token_scores` of ``head(states)`` (``[B, N, H]`` final hidden states, ``[B, N]`` targets), ``chunk``
    positions at a time; under autograd each chunk's logits are recomputed in backward instead of kept."""
    fn = functools.partial(_head_scores, head, entropy_grad)
    logprobs, entropies = [], []
    for start in range(0, states.shape[1], chunk):
        part, tgt = states[:, start : start + chunk], targets[:, start : start + chunk]
        if torch.is_grad_enabled():
            lp, ent = checkpoint(fn, part, tgt, use_reentrant=False)
        else:
            lp, ent = fn(part, tgt)
        logprobs.append(lp)
        entropies.append(ent)
    return torch.cat(logprobs, dim=1), torch.cat(entropies, dim=1)
