"""KL estimators between the policy and a reference, per token (Schulman's k1, k2, k3).

All take ``logp`` (policy) and ``ref_logp`` (reference) log-probs of the *sampled* tokens, shape ``[B, T]``,
and return ``[B, T]``. With ``r = exp(ref_logp - logp)``:
  k1 = -log r           (unbiased, can be negative)
  k2 = ½ (log r)²       (biased, low variance)
  k3 = (r - 1) - log r  (unbiased, always ≥ 0)
"""

from __future__ import annotations

import torch


def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return logp - ref_logp


def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return 0.5 * (ref_logp - logp) ** 2


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    log_ratio = (ref_logp - logp).clamp(-20.0, 20.0)
    return torch.exp(log_ratio) - 1.0 - log_ratio
