import math

import torch

from harmonyrl.algorithms.kl import kl_k1, kl_k2, kl_k3
from harmonyrl.algorithms.losses import masked_token_mean, ppo_clip_loss


def test_ppo_clip_hand_derived() -> None:
    # token 0: ρ=1.5, A=+1 → clipped to 1.28 → -1.28; token 1: ρ=0.5, A=+1 → -0.5 (unclipped branch is smaller)
    # token 2: ρ=0.5, A=-1 → -min(-0.5, -0.8) = 0.8 (clipped); token 3 is padding (mask 0)
    logp = torch.log(torch.tensor([[1.5, 0.5, 0.5, 9.0]]))
    old = torch.zeros(1, 4)
    adv = torch.tensor([[1.0, 1.0, -1.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    out = ppo_clip_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.28)
    assert math.isclose(float(out.loss), (-1.28 - 0.5 + 0.8) / 3, rel_tol=1e-5)
    assert math.isclose(float(out.clip_fraction), 2 / 3, rel_tol=1e-6)
    assert math.isclose(float(out.ratio_max_dev), 0.5, rel_tol=1e-5)


def test_ppo_on_policy_gradient_is_policy_gradient() -> None:
    # with old == new the loss gradient is -A/N per masked token, the vanilla policy gradient
    logp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    adv = torch.tensor([[2.0, -1.0, 3.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    out = ppo_clip_loss(logp, logp.detach(), adv, mask, 0.2, 0.2)
    out.loss.backward()
    assert logp.grad is not None
    assert torch.allclose(logp.grad, torch.tensor([[-1.0, 0.5, 0.0]]))
    assert float(out.ratio_max_dev) == 0.0 and float(out.clip_fraction) == 0.0


def test_masked_token_mean_ignores_padding_and_empty() -> None:
    assert float(masked_token_mean(torch.tensor([[1.0, 3.0, 100.0]]), torch.tensor([[1, 1, 0]]))) == 2.0
    assert float(masked_token_mean(torch.ones(2, 3), torch.zeros(2, 3))) == 0.0


def test_kl_estimators_hand_derived() -> None:
    logp, ref = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
    # log r = log(0.25/0.5) = -log 2; k1 = log 2; k2 = ½ (log 2)²; k3 = (0.5 - 1) + log 2
    assert math.isclose(float(kl_k1(logp, ref)), math.log(2), rel_tol=1e-6)
    assert math.isclose(float(kl_k2(logp, ref)), 0.5 * math.log(2) ** 2, rel_tol=1e-6)
    assert math.isclose(float(kl_k3(logp, ref)), -0.5 + math.log(2), rel_tol=1e-6)
    assert float(kl_k3(logp, logp)) == 0.0
