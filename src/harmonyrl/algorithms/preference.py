"""Preference math for reward models: the Bradley–Terry loss, pairwise accuracy, calibration, and how well a proxy
reward agrees with the true one. Pure functions on tensors / floats.

Bradley–Terry: P(chosen ≻ rejected) = σ(r_c − r_r). With a margin m (how much better the chosen answer is said to
be) the loss is ``−log σ(r_c − r_r − m)`` (Llama 2's margin loss): the pair keeps pushing until the gap exceeds m.
Rewards are only defined up to a constant under this loss; reward centring (Eisenstein et al. 2023) adds
``coef · (r_c + r_r)²`` so the scores stay near 0 and are comparable across runs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F


def bradley_terry_loss(
    chosen: torch.Tensor, rejected: torch.Tensor, margin: torch.Tensor | None = None, centring: float = 0.0
) -> torch.Tensor:
    """Mean over pairs of ``−log σ(r_c − r_r − margin) + centring · (r_c + r_r)²`` (a scalar).

    Shapes: ``chosen`` ``[B]``, ``rejected`` ``[B]``, ``margin`` ``[B]`` or None (0). ``−log σ(x)`` is computed as
    ``softplus(−x)``, which is exact for large |x| where ``log(sigmoid(x))`` underflows to −inf.
    """
    gap = chosen - rejected
    if margin is not None:
        gap = gap - margin
    loss = F.softplus(-gap)
    if centring > 0:
        loss = loss + centring * (chosen + rejected) ** 2
    return loss.mean()


def pairwise_accuracy(chosen: torch.Tensor, rejected: torch.Tensor) -> float:
    """Fraction of pairs whose chosen answer scores strictly higher (a tie counts as wrong). Shapes ``[B]``."""
    if chosen.numel() == 0:
        return float("nan")
    return float((chosen > rejected).double().mean())


def expected_calibration_error(probs: torch.Tensor, bins: int = 10) -> float:
    """ECE of the model's P(chosen ≻ rejected) = σ(r_c − r_r), ``probs`` ``[B]``, against the label "chosen wins".

    Every pair is seen from both sides (p for "chosen wins", 1 − p for "rejected wins"), so the labels are not all
    1 and a model that says 0.5 everywhere is perfectly calibrated. Equal-width bins over [0, 1];
    ECE = Σ_b (n_b / n) · |mean confidence_b − accuracy_b|.
    """
    if probs.numel() == 0:
        return float("nan")
    p = torch.cat([probs, 1 - probs]).double()
    labels = torch.cat([torch.ones_like(probs), torch.zeros_like(probs)]).double()
    which = torch.clamp((p * bins).long(), max=bins - 1)
    total = 0.0
    for b in range(bins):
        inside = which == b
        if inside.any():
            total += float(inside.sum()) / p.numel() * abs(float(p[inside].mean() - labels[inside].mean()))
    return total


def ranking_agreement(proxy: Sequence[float], truth: Sequence[float], groups: Sequence[int]) -> float:
    """Among pairs of episodes of one group whose true rewards differ, the fraction the proxy orders the same way
    (a proxy tie counts half). NaN when no group has two different true rewards. Lengths all equal."""
    if not len(proxy) == len(truth) == len(groups):
        raise ValueError("proxy, truth and groups must have one entry per episode")
    agree, pairs = 0.0, 0
    for i in range(len(proxy)):
        for j in range(i + 1, len(proxy)):
            if groups[i] != groups[j] or truth[i] == truth[j]:
                continue
            pairs += 1
            d_proxy, d_truth = proxy[i] - proxy[j], truth[i] - truth[j]
            agree += 0.5 if d_proxy == 0 else float((d_proxy > 0) == (d_truth > 0))
    return agree / pairs if pairs else math.nan
