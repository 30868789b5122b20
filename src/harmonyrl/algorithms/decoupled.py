"""Decoupled PPO: the policy loss of the asynchronous pipeline (``rl.async.max_staleness > 0``, docs/async.md).

With rollouts ahead of the trainer, three policies meet in one update (Hilton et al. 2021, "Batch size-invariance
for policy optimization", §3; AReaL, Fu et al. 2025, "AReaL: a large-scale asynchronous reinforcement learning
system for language reasoning", eq. 5):

* the **behaviour** policy π_behav, which sampled the tokens: the engine, possibly versions behind
  (``sampler_logprobs``, carried per token);
* the **proximal** policy π_prox, which the update must stay near: the trainer's policy before this update
  (the old-policy pass, :func:`harmonyrl.rl.targets.no_grad_pass`);
* the policy being trained, π_θ.

The objective keeps PPO's trust region around π_prox and corrects the sampling distribution by importance weights::

    J(θ) = E_{a ~ π_behav} [ w · min(r A, clip(r, 1 - ε_low, 1 + ε_high) A) ],
    r = π_θ / π_prox,   w = π_prox / π_behav   (detached; truncated at ``cap`` when given)

With π_behav = π_prox (synchronous, no train/inference mismatch) w = 1 and this is the standard PPO-clip loss.
The trainer computes exactly this when ``rl.correction.weights`` is set (truncated IS at token level:
``apply_correction(prox, behav)`` gives w, and ``ppo_clip_loss`` takes the ratio against ``old_logp`` = π_prox);
this function states it in one place, independently, and the tests hold the two equal.
"""

from __future__ import annotations

import math

import torch

from harmonyrl.algorithms.losses import AggregationMode, PolicyLossOutput, aggregate_loss


def decoupled_ppo_loss(
    logp: torch.Tensor,
    prox_logp: torch.Tensor,
    behav_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    *,
    cap: float | None = None,
    aggregation: AggregationMode = "token-mean",
    norm: float | None = None,
) -> PolicyLossOutput:
    """Decoupled PPO-clip loss (see the module docstring). All tensors ``[B, T]``; scalar loss out.

    Args:
        logp: log π_θ of the sampled tokens (requires grad).
        prox_logp: log π_prox, the trainer's policy before the update (no grad).
        behav_logp: log π_behav, the sampler's log-probs (no grad).
        cap: truncate the behaviour weight ``w`` at ``cap`` (truncated IS); None keeps it whole.
    Per token: ``-w · min(r A, clip(r, 1 - clip_low, 1 + clip_high) A)``, aggregated over ``mask``.

    Example (hand-derived): π_θ = 0.6, π_prox = 0.5, π_behav = 0.25, A = 1, bounds [0.8, 1.28]: r = 1.2,
    w = 2, loss = -2 · 1.2 = -2.4 (with cap 1.5: -1.8).
    """
    m = mask.bool()
    zero = torch.zeros_like(logp)
    log_w = torch.where(m, prox_logp - behav_logp, zero).detach()
    w = torch.exp(log_w if cap is None else log_w.clamp(max=math.log(cap)))
    ratio = torch.exp(logp - prox_logp.detach())
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    objective = torch.minimum(ratio * advantages, clipped * advantages)
    per_token = -objective * w
    with torch.no_grad():
        clip_fraction = ((clipped * advantages < ratio * advantages) & m).sum() / m.sum().clamp(min=1)
        dev = (ratio - 1.0).abs()[m]
        ratio_max_dev = dev.max() if dev.numel() else torch.zeros(())
    return PolicyLossOutput(aggregate_loss(per_token, mask, aggregation, norm), clip_fraction, ratio_max_dev)
