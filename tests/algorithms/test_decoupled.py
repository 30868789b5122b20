"""Decoupled PPO: hand-derived values, standard PPO when behaviour = proximal, and the trainer's own path (PPO-clip
against the old policy with the correction library's truncated weights) computing the same objective."""

from __future__ import annotations

import math

import torch

from harmonyrl.algorithms.correction import RolloutCorrectionConfig, TruncatedIS, apply_correction
from harmonyrl.algorithms.decoupled import decoupled_ppo_loss
from harmonyrl.algorithms.losses import ppo_clip_loss


def _probs(*values: float) -> torch.Tensor:
    return torch.log(torch.tensor([list(values)]))


def test_hand_derived_values() -> None:
    # token 0: π_θ=0.6, π_prox=0.5, π_behav=0.25, A=+1 → r=1.2 (inside [0.8, 1.28]), w=2 → -2·1.2 = -2.4
    # token 1: π_θ=0.3, π_prox=0.5, π_behav=0.5, A=-1 → r=0.6, w=1 → -min(-0.6, -0.8) = 0.8 (clipped)
    # token 2: padding (mask 0). token-mean over 2 tokens: (-2.4 + 0.8) / 2 = -0.8
    logp, prox, behav = _probs(0.6, 0.3, 0.9), _probs(0.5, 0.5, 0.1), _probs(0.25, 0.5, 0.1)
    adv, mask = torch.tensor([[1.0, -1.0, 7.0]]), torch.tensor([[1.0, 1.0, 0.0]])
    out = decoupled_ppo_loss(logp, prox, behav, adv, mask, 0.2, 0.28)
    assert math.isclose(float(out.loss), -0.8, rel_tol=1e-5)
    assert math.isclose(float(out.clip_fraction), 0.5, rel_tol=1e-6)
    assert math.isclose(float(out.ratio_max_dev), 0.4, rel_tol=1e-5)
    # cap 1.5 truncates token 0's weight: (-1.5·1.2 + 0.8) / 2 = -0.5
    capped = decoupled_ppo_loss(logp, prox, behav, adv, mask, 0.2, 0.28, cap=1.5)
    assert math.isclose(float(capped.loss), -0.5, rel_tol=1e-5)


def test_gradient_is_the_weighted_policy_gradient_inside_the_trust_region() -> None:
    # at θ = prox the ratio is 1: d/dlogp of -w·r·A is -w·A per token, divided by the 2 masked tokens
    prox = _probs(0.5, 0.4)
    logp = prox.clone().requires_grad_(True)
    behav = _probs(0.25, 0.8)  # w = 2 and 0.5
    adv, mask = torch.tensor([[1.0, 3.0]]), torch.ones(1, 2)
    decoupled_ppo_loss(logp, prox, behav, adv, mask, 0.2, 0.2).loss.backward()
    assert logp.grad is not None
    assert torch.allclose(logp.grad, torch.tensor([[-2.0 * 1.0 / 2, -0.5 * 3.0 / 2]]))


def _batch(seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    prox = -torch.rand(4, 9, generator=g) * 3
    logp = prox + 0.3 * torch.randn(4, 9, generator=g)
    behav = prox + 0.5 * torch.randn(4, 9, generator=g)
    adv = torch.randn(4, 9, generator=g)
    mask = (torch.rand(4, 9, generator=g) > 0.3).float()
    return logp, prox, behav, adv, mask


def test_equals_standard_ppo_when_behaviour_is_proximal() -> None:
    logp, prox, _, adv, mask = _batch(0)
    for agg in ("token-mean", "seq-mean-token-mean"):
        a = decoupled_ppo_loss(logp, prox, prox, adv, mask, 0.2, 0.28, aggregation=agg)
        b = ppo_clip_loss(logp, prox, adv, mask, 0.2, 0.28, aggregation=agg)
        assert torch.equal(a.loss, b.loss)
        assert torch.equal(a.clip_fraction, b.clip_fraction)


def test_the_trainers_path_computes_the_decoupled_objective() -> None:
    # what rl_targets.loss_targets + rl.policy_loss do with rl.correction.weights=truncate (high 2)
    logp, prox, behav, adv, mask = _batch(1)
    cfg = RolloutCorrectionConfig(weights=TruncatedIS(high=2.0))
    weights = apply_correction(prox, behav, mask, cfg).weights
    trainer = ppo_clip_loss(logp, prox, adv, mask, 0.2, 0.28, weights=weights)
    ours = decoupled_ppo_loss(logp, prox, behav, adv, mask, 0.2, 0.28, cap=2.0)
    assert torch.allclose(trainer.loss, ours.loss, rtol=1e-6, atol=0)
    uncorrected = ppo_clip_loss(logp, prox, adv, mask, 0.2, 0.28)
    assert not torch.allclose(uncorrected.loss, ours.loss)  # the weights matter on this batch
