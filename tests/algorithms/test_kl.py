import math

import pytest
import torch
from algo_batches import make_batch

from harmonyrl.algorithms.kl import KLEstimator, kl_estimate, kl_loss, kl_reward_penalty

LN2 = math.log(2)


def test_kl_estimate_dispatch_hand_derived() -> None:
    # log r = ref - logp = -ln 2 → k1 = ln 2, k2 = ½ ln²2, k3 = (0.5 - 1) + ln 2
    logp, ref = torch.tensor([[math.log(0.5)]]), torch.tensor([[math.log(0.25)]])
    assert float(kl_estimate(logp, ref, "k1")) == pytest.approx(LN2)
    assert float(kl_estimate(logp, ref, "k2")) == pytest.approx(0.5 * LN2**2)
    assert float(kl_estimate(logp, ref, "k3")) == pytest.approx(LN2 - 0.5)


def _three_tokens() -> tuple[torch.Tensor, torch.Tensor]:
    logp = torch.log(torch.tensor([[0.5, 0.5, 0.25]]))
    ref = torch.log(torch.tensor([[0.25, 0.5, 0.5]]))
    return logp, ref


def test_kl_reward_penalty_hand_derived() -> None:
    # k1 = logp - ref = [ln 2, 0, -ln 2]; coef 0.1 → rewards [0, 0, 1] - 0.1·k1 = [-0.1 ln2, 0, 1 + 0.1 ln2];
    # a masked-out token keeps its reward
    logp, ref = _three_tokens()
    shaped = kl_reward_penalty(torch.tensor([[0.0, 0.0, 1.0]]), logp, ref, torch.ones(1, 3), 0.1)
    assert torch.allclose(shaped, torch.tensor([[-0.1 * LN2, 0.0, 1 + 0.1 * LN2]]))
    shaped = kl_reward_penalty(torch.tensor([[0.0, 0.0, 1.0]]), logp, ref, torch.tensor([[0, 1, 1]]), 0.1)
    assert float(shaped[0, 0]) == 0.0


def test_kl_loss_hand_derived() -> None:
    # k3 per token with r = ref/p: r=0.5 → 0.5 - 1 + ln2; r=1 → 0; r=2 → 2 - 1 - ln2; sum = 0.5 exactly
    # token-mean 0.5/3, coef 0.5 → 1/12; gradient of k3 w.r.t. logp is 1 - r → [0.5, 0, -1] · 0.5/3
    logp, ref = _three_tokens()
    logp.requires_grad_(True)
    loss = kl_loss(logp, ref, torch.ones(1, 3), 0.5)
    assert float(loss.detach()) == pytest.approx(1 / 12)
    loss.backward()
    assert logp.grad is not None
    assert torch.allclose(logp.grad, torch.tensor([[0.5, 0.0, -1.0]]) * 0.5 / 3)


@pytest.mark.parametrize("seed", range(40))
def test_kl_penalty_and_loss_match_loop(seed: int) -> None:
    b = make_batch(seed)
    estimators: list[KLEstimator] = ["k1", "k2", "k3"]
    for est in estimators:
        shaped = kl_reward_penalty(b.token_rewards, b.logp, b.ref_logp, b.mask, 0.3, est)
        loss = kl_loss(b.logp, b.ref_logp, b.mask, 0.3, est)
        terms = []
        for i in range(b.mask.shape[0]):
            for j in range(b.mask.shape[1]):
                lr = float(b.ref_logp[i, j] - b.logp[i, j])
                kl = {"k1": -lr, "k2": 0.5 * lr * lr, "k3": math.exp(lr) - 1 - lr}[est]
                valid = b.mask[i, j] > 0
                expected = float(b.token_rewards[i, j]) - (0.3 * kl if valid else 0.0)
                assert math.isclose(float(shaped[i, j]), expected, rel_tol=1e-9, abs_tol=1e-12)
                if valid:
                    terms.append(kl)
        expected_loss = 0.3 * sum(terms) / len(terms) if terms else 0.0
        assert math.isclose(float(loss), expected_loss, rel_tol=1e-9, abs_tol=1e-12)
