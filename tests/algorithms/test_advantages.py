import math

import pytest
import torch
from algo_batches import make_batch
from hypothesis import given, settings
from hypothesis import strategies as st

from harmonyrl.algorithms.advantages import (
    a2c_advantages,
    broadcast_to_tokens,
    dr_grpo_advantages,
    gae_advantages,
    group_relative_advantages,
    outcome_to_token_rewards,
    reinforce_pp_advantages,
    rloo_advantages,
    value_loss,
)


def test_grpo_hand_derived() -> None:
    # group 0: mean 1/3, unbiased std sqrt(((2/3)^2 + 2*(1/3)^2) / 2) = sqrt(1/3); group 1: all equal → 0
    adv = group_relative_advantages(torch.tensor([1.0, 0, 0, 1, 1, 1]), torch.tensor([0, 0, 0, 1, 1, 1]))
    s = math.sqrt(1 / 3)
    expected = torch.tensor([(2 / 3) / s, -(1 / 3) / s, -(1 / 3) / s, 0, 0, 0])
    assert torch.allclose(adv, expected, atol=1e-5)


def test_dr_grpo_is_centred_only() -> None:
    adv = group_relative_advantages(torch.tensor([3.0, 1.0, 5.0]), torch.tensor([7, 7, 2]), std_normalize=False)
    assert torch.allclose(adv, torch.tensor([1.0, -1.0, 0.0]))


def test_group_of_one_gets_zero() -> None:
    adv = group_relative_advantages(torch.tensor([0.7]), torch.tensor([4]))
    assert adv.tolist() == [0.0]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 4), st.sampled_from([0.0, 0.5, 1.0])), min_size=1, max_size=20),
    st.booleans(),
)
def test_vectorised_matches_loop(rows: list[tuple[int, float]], std_norm: bool) -> None:
    groups = torch.tensor([g for g, _ in rows])
    rewards = torch.tensor([r for _, r in rows])
    adv = group_relative_advantages(rewards, groups, std_normalize=std_norm)
    for i, (g, r) in enumerate(rows):
        members = [rr for gg, rr in rows if gg == g]
        mean = sum(members) / len(members)
        expected = r - mean
        if std_norm:
            var = sum((x - mean) ** 2 for x in members) / max(len(members) - 1, 1)
            expected /= math.sqrt(var) + 1e-6
        assert abs(float(adv[i]) - expected) < 1e-4


def test_broadcast_zero_outside_mask() -> None:
    out = broadcast_to_tokens(torch.tensor([2.0, -1.0]), torch.tensor([[0, 1, 1], [1, 0, 0]]))
    assert out.tolist() == [[0.0, 2.0, 2.0], [-1.0, 0.0, 0.0]]


# ---------------------------------------------------------------- Dr.GRPO, RLOO


def test_dr_grpo_named_function_matches_flag() -> None:
    r, g = torch.tensor([3.0, 1.0, 5.0]), torch.tensor([7, 7, 2])
    assert dr_grpo_advantages(r, g).tolist() == [1.0, -1.0, 0.0]


def test_rloo_hand_derived() -> None:
    # group 0 = [1, 0, 0]: 1 - (0+0)/2 = 1; 0 - (1+0)/2 = -0.5 (twice). group 1 = [3, 1, 2]:
    # 3 - (1+2)/2 = 1.5; 1 - (3+2)/2 = -1.5; 2 - (3+1)/2 = 0. group 2 = [0.7] alone → 0.
    r = torch.tensor([1.0, 0, 0, 3, 1, 2, 0.7])
    g = torch.tensor([0, 0, 0, 1, 1, 1, 2])
    assert torch.allclose(rloo_advantages(r, g), torch.tensor([1.0, -0.5, -0.5, 1.5, -1.5, 0.0, 0.0]))


@pytest.mark.parametrize("seed", range(40))
def test_rloo_matches_loop(seed: int) -> None:
    b = make_batch(seed)
    adv = rloo_advantages(b.rewards, b.group_ids)
    for i in range(len(b.rewards)):
        others = [float(b.rewards[j]) for j in range(len(b.rewards)) if b.group_ids[j] == b.group_ids[i] and j != i]
        expected = float(b.rewards[i]) - sum(others) / len(others) if others else 0.0
        assert math.isclose(float(adv[i]), expected, abs_tol=1e-9)


# ---------------------------------------------------------------- REINFORCE++


def test_outcome_rewards_land_on_last_sampled_token() -> None:
    mask = torch.tensor([[1, 0, 1, 0], [0, 0, 0, 0], [0, 1, 1, 1]])
    out = outcome_to_token_rewards(torch.tensor([2.0, 5.0, -1.0]), mask)
    assert out.tolist() == [[0, 0, 2.0, 0], [0, 0, 0, 0], [0, 0, 0, -1.0]]


def test_reinforce_pp_hand_derived() -> None:
    # row 0 mask [1,0,1] (hole = tool output), reward 1, γ=0.5 → returns [0.5, ·, 1] (the hole is no step);
    # row 1 mask [1,1,0], reward 0 → returns [0, 0]. Masked returns {0.5, 1, 0, 0}: μ = 0.375,
    # σ² = (0.125² + 0.625² + 2·0.375²)/4 = 0.171875, σ = 0.414578 → [0.301511, 1.507557] and [-0.904534]×2.
    mask = torch.tensor([[1.0, 0, 1], [1, 1, 0]])
    adv = reinforce_pp_advantages(torch.tensor([1.0, 0.0]), mask, gamma=0.5)
    expected = torch.tensor([[0.301511, 0, 1.507557], [-0.904534, -0.904534, 0]])
    assert torch.allclose(adv, expected, atol=1e-5)


def test_reinforce_pp_baseline_hand_derived() -> None:
    # same group: mean 0.5 → outcome [0.5, -0.5]; γ=0.5 → row 0 returns [0.25, ·, 0.5], row 1 [-0.25, -0.5].
    # μ = 0, σ² = (2·0.0625 + 2·0.25)/4 = 0.15625, σ = 0.395285 → ±0.632456, ±1.264911
    mask = torch.tensor([[1.0, 0, 1], [1, 1, 0]])
    adv = reinforce_pp_advantages(torch.tensor([1.0, 0.0]), mask, gamma=0.5, group_ids=torch.tensor([3, 3]))
    expected = torch.tensor([[0.632456, 0, 1.264911], [-0.632456, -1.264911, 0]])
    assert torch.allclose(adv, expected, atol=1e-5)


def _loop_returns(rewards: list[float], gamma: float) -> list[float]:
    out, g = [0.0] * len(rewards), 0.0
    for k in reversed(range(len(rewards))):
        g = rewards[k] + gamma * g
        out[k] = g
    return out


@pytest.mark.parametrize("seed", range(40))
def test_reinforce_pp_matches_loop(seed: int) -> None:
    b = make_batch(seed)
    gamma = 0.9
    use_baseline = seed % 2 == 0
    adv = reinforce_pp_advantages(
        b.rewards, b.mask, gamma, group_ids=b.group_ids if use_baseline else None, token_rewards=b.token_rewards
    )
    outcome = [float(x) for x in b.rewards]
    if use_baseline:
        for i in range(len(outcome)):
            members = [float(b.rewards[j]) for j in range(len(outcome)) if b.group_ids[j] == b.group_ids[i]]
            outcome[i] = float(b.rewards[i]) - sum(members) / len(members)
    returns: dict[tuple[int, int], float] = {}
    for i, pos in enumerate(b.rows()):
        r = [float(b.token_rewards[i, j]) for j in pos]
        if pos:
            r[-1] += outcome[i]
        returns.update({(i, j): g for j, g in zip(pos, _loop_returns(r, gamma), strict=True)})
    vals = list(returns.values())
    mean = sum(vals) / max(len(vals), 1)
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / max(len(vals), 1) + 1e-8)
    for i in range(b.mask.shape[0]):
        for j in range(b.mask.shape[1]):
            expected = (returns[i, j] - mean) / std if (i, j) in returns else 0.0
            assert math.isclose(float(adv[i, j]), expected, abs_tol=1e-7)


# ---------------------------------------------------------------- GAE, A2C


def _gae_row() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    mask = torch.tensor([[1.0, 0, 1, 1, 0]])  # position 1 is tool output, position 4 padding
    rewards = torch.tensor([[0.0, 5.0, 0.0, 1.0, 9.0]])  # rewards off the mask are ignored
    values = torch.tensor([[0.5, 7.0, 0.25, 0.5, 3.0]])
    return rewards, values, mask


def test_gae_hand_derived_skips_tool_tokens() -> None:
    # steps are t0 → t2 → t3 → end; γ=0.9, λ=0.8 (γλ = 0.72):
    # t3: δ = 1 + 0 - 0.5 = 0.5, A = 0.5;  t2: δ = 0 + 0.9·0.5 - 0.25 = 0.2, A = 0.2 + 0.72·0.5 = 0.56
    # t0: δ = 0 + 0.9·0.25 - 0.5 = -0.275, A = -0.275 + 0.72·0.56 = 0.1282; returns = A + V
    rewards, values, mask = _gae_row()
    adv, ret = gae_advantages(rewards, values, mask, gamma=0.9, lam=0.8)
    assert torch.allclose(adv, torch.tensor([[0.1282, 0, 0.56, 0.5, 0]]), atol=1e-6)
    assert torch.allclose(ret, torch.tensor([[0.6282, 0, 0.81, 1.0, 0]]), atol=1e-6)


def test_gae_bootstrap_for_truncated_episode() -> None:
    # V after the last token = 2, γ = λ = 1: t1: δ = 0 + 2 - 1 = 1, A = 1; t0: δ = 0 + 1 - 1 = 0, A = 0 + 1 = 1
    adv, ret = gae_advantages(torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2), bootstrap=torch.tensor([2.0]))
    assert adv.tolist() == [[1.0, 1.0]] and ret.tolist() == [[2.0, 2.0]]


def test_a2c_one_step_hand_derived() -> None:
    # λ = 0: A = δ → t3: 0.5, t2: 0.2, t0: -0.275; TD targets r + γV' → 1.0, 0.45, 0.225
    rewards, values, mask = _gae_row()
    adv, target = a2c_advantages(rewards, values, mask, gamma=0.9)
    assert torch.allclose(adv, torch.tensor([[-0.275, 0, 0.2, 0.5, 0]]), atol=1e-6)
    assert torch.allclose(target, torch.tensor([[0.225, 0, 0.45, 1.0, 0]]), atol=1e-6)


@pytest.mark.parametrize("seed", range(40))
def test_gae_matches_loop(seed: int) -> None:
    b = make_batch(seed)
    gamma, lam = 0.95, [0.0, 0.7, 1.0][seed % 3]
    boot = torch.linspace(-1, 1, b.mask.shape[0], dtype=torch.float64) if seed % 2 else None
    adv, ret = gae_advantages(b.token_rewards, b.values, b.mask, gamma, lam, bootstrap=boot)
    expected = torch.zeros_like(adv)
    for i, pos in enumerate(b.rows()):
        next_v, next_a = (0.0 if boot is None else float(boot[i])), 0.0
        for j in reversed(pos):
            delta = float(b.token_rewards[i, j]) + gamma * next_v - float(b.values[i, j])
            next_a = delta + gamma * lam * next_a
            next_v = float(b.values[i, j])
            expected[i, j] = next_a
    assert torch.allclose(adv, expected, atol=1e-10)
    assert torch.allclose(ret, torch.where(b.mask > 0, expected + b.values, 0.0), atol=1e-10)
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()


# ---------------------------------------------------------------- value loss


def test_value_loss_clipped_hand_derived() -> None:
    # t0: (1-2)² = 1; clipped V = 0.5 + clip(0.5, ±0.2) = 0.7, (0.7-2)² = 1.69 → ½·1.69 = 0.845 (clipped wins)
    # t1: (2.1-2)² = 0.01; clipped V = 2.1 (inside), same → ½·0.01 = 0.005; t2 padding.
    # token-mean = (0.845 + 0.005)/2 = 0.425; clip fraction 1/2; t0's gradient is 0 (clipped branch is flat)
    values = torch.tensor([[1.0, 2.1, 0.0]], requires_grad=True)
    old, ret, mask = torch.tensor([[0.5, 2.0, 0.0]]), torch.tensor([[2.0, 2.0, 5.0]]), torch.tensor([[1.0, 1, 0]])
    out = value_loss(values, old, ret, mask, clip=0.2)
    assert math.isclose(float(out.loss.detach()), 0.425, rel_tol=1e-5) and float(out.clip_fraction) == 0.5
    out.loss.backward()
    assert values.grad is not None and float(values.grad[0, 0]) == 0.0 and float(values.grad[0, 2]) == 0.0
    unclipped = value_loss(values.detach(), old, ret, mask)  # ½(1 + 0.01)/2
    assert math.isclose(float(unclipped.loss), 0.2525, rel_tol=1e-5)


@pytest.mark.parametrize("seed", range(40))
def test_value_loss_matches_loop(seed: int) -> None:
    b = make_batch(seed)
    new_v = torch.where(b.mask > 0, b.values + 0.3 * b.token_adv, b.values)
    out = value_loss(new_v, b.values, b.token_rewards, b.mask, clip=0.2)
    terms = []
    for i, pos in enumerate(b.rows()):
        for j in pos:
            v, o, r = float(new_v[i, j]), float(b.values[i, j]), float(b.token_rewards[i, j])
            vc = o + min(max(v - o, -0.2), 0.2)
            terms.append(0.5 * max((v - r) ** 2, (vc - r) ** 2))
    expected = sum(terms) / len(terms) if terms else 0.0
    assert math.isclose(float(out.loss), expected, rel_tol=1e-9, abs_tol=1e-12)
