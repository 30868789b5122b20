"""Every function on a batch whose responses are all zero-length: finite values and gradients, no NaN."""

import math

import torch

from harmonyrl.algorithms.advantages import (
    a2c_advantages,
    gae_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
    value_loss,
)
from harmonyrl.algorithms.correction import (
    MaskedIS,
    Rejection,
    RolloutCorrectionConfig,
    TruncatedIS,
    apply_correction,
)
from harmonyrl.algorithms.kl import kl_loss, kl_reward_penalty
from harmonyrl.algorithms.losses import entropy_bonus, gspo_loss, policy_gradient_loss, ppo_clip_loss
from harmonyrl.algorithms.mismatch import mismatch_metrics

B, T = 3, 4


def _finite(*tensors: torch.Tensor) -> bool:
    return all(bool(torch.isfinite(x).all()) for x in tensors)


def test_all_zero_mask_gives_finite_outputs_and_gradients() -> None:
    mask = torch.zeros(B, T)
    logp = torch.full((B, T), -1.0, requires_grad=True)
    old, adv, vals = torch.full((B, T), -3.0), torch.ones(B, T), torch.ones(B, T)
    rewards, groups = torch.tensor([1.0, 1.0, 0.0]), torch.tensor([0, 0, 1])
    assert _finite(rloo_advantages(rewards, groups), reinforce_pp_advantages(rewards, mask, 0.9, groups))
    assert _finite(*gae_advantages(vals, vals, mask, 0.9, 0.95), *a2c_advantages(vals, vals, mask))
    assert reinforce_pp_advantages(rewards, mask).abs().sum() == 0
    losses = [
        ppo_clip_loss(logp, old, adv, mask, 0.2, 0.28, dual_clip=3.0).loss,
        gspo_loss(logp, old, adv, mask, 3e-4, 4e-4).loss,
        policy_gradient_loss(logp, adv, mask, aggregation="seq-mean-token-sum-norm", norm=4.0).loss,
        entropy_bonus(-logp, mask, 0.01, "seq-mean-token-mean"),
        kl_loss(logp, old, mask, 0.1),
        value_loss(logp, old, vals, mask, clip=0.2).loss,
    ]
    total = torch.stack(losses).sum()
    total.backward()
    assert float(total.detach()) == 0.0 and logp.grad is not None and _finite(logp.grad)
    assert _finite(kl_reward_penalty(vals, logp, old, mask, 0.1, "k3"))
    for weights in (TruncatedIS(level="sequence", normalize=True), MaskedIS(level="geometric", normalize=True)):
        cfg = RolloutCorrectionConfig(weights=weights, rejection=Rejection(level="sequence", threshold=0.1))
        out = apply_correction(old, logp.detach(), mask, cfg)
        assert _finite(out.weights) and out.weights.abs().sum() == 0
        metrics = mismatch_metrics(old, logp, mask, out)
        assert all(math.isfinite(v) for v in metrics.values())
