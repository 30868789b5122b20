"""Sampler/trainer mismatch diagnostics, logged every step.

All take ``[B, T]`` ``trainer_logp``, ``sampler_logp`` and ``mask`` and return plain floats. Tokens are
drawn from the sampler, so the KL estimates are of KL(sampler ‖ trainer); the importance weight of a token is
``w_t = exp(ℓ_t)``, ``ℓ_t = trainer_logp_t - sampler_logp_t``; a sequence's weight is ``W = exp(Σ_t ℓ_t)``.
Sequence statistics are over sequences with at least one masked token. With nothing masked every metric is
a finite default (0, ESS 1). Computed in float64; log-weights clamped to ±20 as in :mod:`.correction`.
"""

from __future__ import annotations

import torch

from harmonyrl.algorithms.correction import LOG_WEIGHT_CLAMP, CorrectionOutput
from harmonyrl.algorithms.kl import kl_k3


def _mean(values: torch.Tensor, valid: torch.Tensor) -> float:
    sel = values[valid]
    return float(sel.mean()) if sel.numel() else 0.0


def chi2_and_ess(weights: torch.Tensor, valid: torch.Tensor) -> tuple[float, float]:
    """χ² divergence estimate ``E[w²] - 1`` and effective sample size ``(Σw)² / (N Σw²)`` over ``valid``.

    ``weights`` and ``valid`` have the same shape (``[B, T]`` tokens or ``[B]`` sequences). No valid entry
    gives (0, 1); all-zero weights give (-1, 1) — ESS is defined as 1 when Σw² = 0.
    """
    w = weights[valid].to(torch.float64)
    if w.numel() == 0:
        return 0.0, 1.0
    sq = (w**2).sum()
    chi2 = float(sq / w.numel() - 1.0)
    ess = float(w.sum() ** 2 / (w.numel() * sq)) if float(sq) > 0 else 1.0
    return chi2, ess


def log_ppl_diff(trainer_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-sequence ``log ppl_trainer - log ppl_sampler = mean_t (sampler_logp - trainer_logp)``: ``[B]``.

    Empty rows give 0.
    """
    m = mask.bool()
    diff = torch.where(m, sampler_logp.double() - trainer_logp.double(), torch.zeros((), dtype=torch.float64))
    return diff.sum(dim=-1) / m.sum(dim=-1).clamp(min=1)


def mismatch_metrics(
    trainer_logp: torch.Tensor,
    sampler_logp: torch.Tensor,
    mask: torch.Tensor,
    correction: CorrectionOutput | None = None,
    prefix: str = "mismatch/",
) -> dict[str, float]:
    """Every mismatch metric of one step as ``{prefix + name: value}``.

    kl_k1 = mean_t (s - t); kl_k3 = mean_t k3; log_ppl_diff_{mean,abs_mean,max,min} over sequences of
    mean_t (s - t); ppl_ratio = mean_seq exp(that); chi2_{token,seq} = E[w²] - 1; ess_{token,seq} =
    (Σw)²/(N Σw²); plus the truncated/masked/rejected fractions of ``correction`` when given.
    """
    m = mask.bool()
    t, s = trainer_logp.detach().double(), sampler_logp.detach().double()
    rows = m.any(dim=-1)
    lr = torch.where(m, t - s, torch.zeros_like(t))
    diff = log_ppl_diff(t, s, mask)[rows]
    w_tok = torch.exp(lr.clamp(-LOG_WEIGHT_CLAMP, LOG_WEIGHT_CLAMP))
    w_seq = torch.exp(lr.sum(dim=-1).clamp(-LOG_WEIGHT_CLAMP, LOG_WEIGHT_CLAMP))
    chi2_tok, ess_tok = chi2_and_ess(w_tok, m)
    chi2_seq, ess_seq = chi2_and_ess(w_seq, rows)
    has = diff.numel() > 0
    out = {
        "kl_k1": _mean(-lr, m),
        "kl_k3": _mean(kl_k3(s, t), m),
        "log_ppl_diff_mean": float(diff.mean()) if has else 0.0,
        "log_ppl_diff_abs_mean": float(diff.abs().mean()) if has else 0.0,
        "log_ppl_diff_max": float(diff.max()) if has else 0.0,
        "log_ppl_diff_min": float(diff.min()) if has else 0.0,
        "ppl_ratio": float(torch.exp(diff.clamp(-LOG_WEIGHT_CLAMP, LOG_WEIGHT_CLAMP)).mean()) if has else 1.0,
        "chi2_token": chi2_tok,
        "chi2_seq": chi2_seq,
        "ess_token": ess_tok,
        "ess_seq": ess_seq,
        "max_abs_logprob_diff": float(lr.abs().max()) if bool(m.any()) else 0.0,
    }
    if correction is not None:
        out["truncated_fraction"] = float(correction.truncated_fraction)
        out["masked_fraction"] = float(correction.masked_fraction)
        out["rejected_token_fraction"] = float(correction.rejected_token_fraction)
        out["rejected_seq_fraction"] = float(correction.rejected_seq_fraction)
    return {prefix + k: v for k, v in out.items()}
