"""KL estimators between the policy and a reference, per token (Schulman's k1, k2, k3).

All take ``logp`` (policy) and ``ref_logp`` (reference) log-probs of the *sampled* tokens, shape ``[B, T]``,
and return ``[B, T]``. With ``r = exp(ref_logp - logp)``:
  k1 = -log r           (unbiased, can be negative)
  k2 = ½ (log r)²       (biased, low variance)
  k3 = (r - 1) - log r  (unbiased, always ≥ 0)

A KL to a reference enters training either as a per-token reward penalty (:func:`kl_reward_penalty`, no
gradient, shapes the advantages) or as a loss term (:func:`kl_loss`, differentiated through ``logp``).
"""

from __future__ import annotations

from typing import Literal

import torch

from harmonyrl.algorithms.losses import AggregationMode, aggregate_loss


def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return logp - ref_logp


def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return 0.5 * (ref_logp - logp) ** 2


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    log_ratio = (ref_logp - logp).clamp(-20.0, 20.0)
    return torch.exp(log_ratio) - 1.0 - log_ratio


KLEstimator = Literal["k1", "k2", "k3"]


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: KLEstimator) -> torch.Tensor:
    """Per-token KL estimate ``[B, T]`` chosen by a typed literal: k1, k2 or k3 (see the module docstring)."""
    if estimator == "k1":
        return kl_k1(logp, ref_logp)
    if estimator == "k2":
        return kl_k2(logp, ref_logp)
    if estimator == "k3":
        return kl_k3(logp, ref_logp)
    raise ValueError(f"unknown KL estimator {estimator!r}")


def kl_reward_penalty(
    token_rewards: torch.Tensor,
    logp: torch.Tensor,
    ref_logp: torch.Tensor,
    mask: torch.Tensor,
    coef: float,
    estimator: KLEstimator = "k1",
) -> torch.Tensor:
    """KL as reward shaping: ``r'_t = r_t - coef · m_t · sg[kl_t]``. All ``[B, T]`` → ``[B, T]``.

    The penalty is detached: it flows into the loss only through the advantages (PPO-RLHF, REINFORCE++).
    Masked positions keep their reward untouched.
    """
    kl = kl_estimate(logp.detach(), ref_logp.detach(), estimator)
    penalty = torch.where(mask.bool(), kl, torch.zeros_like(kl)) * mask.to(kl.dtype)
    return token_rewards - coef * penalty


def kl_loss(
    logp: torch.Tensor,
    ref_logp: torch.Tensor,
    mask: torch.Tensor,
    coef: float,
    estimator: KLEstimator = "k3",
    aggregation: AggregationMode = "token-mean",
    norm: float | None = None,
) -> torch.Tensor:
    """KL as a loss term: ``coef · agg(kl(logp, ref_logp))`` with gradient through ``logp``. ``[B, T]`` → scalar.

    k3 is GRPO's choice (unbiased value, low variance); ``ref_logp`` is treated as a constant.
    """
    return coef * aggregate_loss(kl_estimate(logp, ref_logp.detach(), estimator), mask, aggregation, norm)
