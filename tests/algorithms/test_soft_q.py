import math
from collections.abc import Callable

import pytest
import torch
from algo_batches import GARBAGE, make_batch

from harmonyrl.algorithms.losses import AggregationMode
from harmonyrl.algorithms.soft_q import (
    next_sampled_index,
    policy_entropy,
    soft_bellman_targets,
    soft_q_loss,
    soft_values,
    taken_q_values,
    temperature_loss,
)

LN3, LN4 = math.log(3), math.log(4)


def _logits(seed: int, shape: tuple[int, ...]) -> torch.Tensor:
    return 2.0 * torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


# ---------------------------------------------------------------- values and entropy


def test_soft_value_and_entropy_hand_derived() -> None:
    # Q = [0, ln 3], α = 1 → V = ln(e^0 + e^ln3) = ln 4; π = [1/4, 3/4];
    # H = -(1/4 ln 1/4 + 3/4 ln 3/4) = ln 4 - (3/4) ln 3.
    q = torch.tensor([[[0.0, LN3]]], dtype=torch.float64)
    assert float(soft_values(q, 1.0)) == pytest.approx(LN4)
    assert float(policy_entropy(q, 1.0)) == pytest.approx(LN4 - 0.75 * LN3)
    # α = 0.5 → Q/α = [0, 2 ln 3] → V = 0.5 ln(1 + 9); π = [1/10, 9/10], H = -(0.1 ln 0.1 + 0.9 ln 0.9)
    assert float(soft_values(q, 0.5)) == pytest.approx(0.5 * math.log(10))
    assert float(policy_entropy(q, 0.5)) == pytest.approx(-(0.1 * math.log(0.1) + 0.9 * math.log(0.9)))
    # α → 0: V → max Q (hard Q-learning), H → 0
    assert float(soft_values(q, 1e-3)) == pytest.approx(LN3, abs=1e-6)
    with pytest.raises(ValueError, match="alpha"):
        soft_values(q, 0.0)


@pytest.mark.parametrize("seed", range(10))
def test_values_entropy_gather_match_loop(seed: int) -> None:
    logits, alpha = _logits(seed, (3, 4, 5)), 0.3 + 0.2 * seed
    actions = torch.randint(0, 5, (3, 4), generator=torch.Generator().manual_seed(seed))
    v, h, q = soft_values(logits, alpha), policy_entropy(logits, alpha), taken_q_values(logits, actions)
    for i in range(3):
        for t in range(4):
            row = [float(x) for x in logits[i, t]]
            z = sum(math.exp(x / alpha) for x in row)
            probs = [math.exp(x / alpha) / z for x in row]
            assert float(v[i, t]) == pytest.approx(alpha * math.log(z))
            assert float(h[i, t]) == pytest.approx(-sum(p * math.log(p) for p in probs))
            assert float(q[i, t]) == row[int(actions[i, t])]


# ---------------------------------------------------------------- next index and targets


def test_next_index_and_targets_hand_derived() -> None:
    # Row 0: three sampled tokens, reward 1, γ = 0.9, V = [0.2, 0.5, 0.9] → [0.9·0.5, 0.9·0.9, 1].
    # Row 1: prompt, two sampled tokens, two tool-output tokens, one sampled token, padding; reward 0.5.
    #   next index [-, 2, 5, -, -, -, -]; targets t1 = γ V2, t2 = γ V5 (skips the tool output), t5 = 0.5.
    # Row 2: zero-length response → all -1 and all-zero targets.
    mask = torch.tensor([[1, 1, 1, 0, 0, 0, 0], [0, 1, 1, 0, 0, 1, 0], [0, 0, 0, 0, 0, 0, 0]], dtype=torch.float64)
    v = torch.tensor(
        [
            [0.2, 0.5, 0.9, GARBAGE, GARBAGE, GARBAGE, GARBAGE],
            [GARBAGE, 0.1, 0.3, GARBAGE, GARBAGE, 0.7, GARBAGE],
            [GARBAGE] * 7,
        ],
        dtype=torch.float64,
    )
    assert next_sampled_index(mask).tolist() == [[1, 2, -1, -1, -1, -1, -1], [-1, 2, 5, -1, -1, -1, -1], [-1] * 7]
    targets = soft_bellman_targets(torch.tensor([1.0, 0.5, 1.0], dtype=torch.float64), v, mask, gamma=0.9)
    expected = [[0.45, 0.81, 1.0, 0, 0, 0, 0], [0, 0.27, 0.63, 0, 0, 0.5, 0], [0.0] * 7]
    assert torch.allclose(targets, torch.tensor(expected, dtype=torch.float64))
    # Shaping rewards add at masked positions only: +0.1 on row 1's tokens, +5 on a tool token is ignored.
    shaping = torch.zeros_like(mask)
    shaping[1, 1], shaping[1, 3] = 0.1, 5.0
    shaped = soft_bellman_targets(torch.tensor([1.0, 0.5, 1.0]).double(), v, mask, 0.9, token_rewards=shaping)
    assert float(shaped[1, 1]) == pytest.approx(0.37) and float(shaped[1, 3]) == 0.0


def _loop_next(mask_row: list[float]) -> list[int]:
    out = []
    for t, m in enumerate(mask_row):
        later = [j for j in range(t + 1, len(mask_row)) if mask_row[j] > 0]
        out.append(later[0] if m > 0 and later else -1)
    return out


@pytest.mark.parametrize("seed", range(40))
def test_next_index_and_targets_match_loop(seed: int) -> None:
    b = make_batch(seed)  # padding, tool-output holes, zero-length rows, sometimes B = 1
    gamma = [1.0, 0.9, 0.5][seed % 3]
    nxt = next_sampled_index(b.mask)
    plain = soft_bellman_targets(b.rewards, b.values, b.mask, gamma)
    shaped = soft_bellman_targets(b.rewards, b.values, b.mask, gamma, token_rewards=b.token_rewards)
    for i, row in enumerate(b.mask.tolist()):
        assert nxt[i].tolist() == _loop_next(row)
        for t, m in enumerate(row):
            if m == 0:
                expected = 0.0
            elif _loop_next(row)[t] >= 0:
                expected = gamma * float(b.values[i, _loop_next(row)[t]])
            else:
                expected = float(b.rewards[i])
            assert float(plain[i, t]) == pytest.approx(expected)
            bonus = float(b.token_rewards[i, t]) if m > 0 else 0.0
            assert float(shaped[i, t]) == pytest.approx(expected + bonus)


def test_targets_detach_and_check_shapes() -> None:
    v = torch.ones(1, 3, requires_grad=True)
    out = soft_bellman_targets(torch.ones(1), v, torch.ones(1, 3))
    assert not out.requires_grad
    with pytest.raises(ValueError, match=r"\[B\]"):
        soft_bellman_targets(torch.ones(1, 1), v, torch.ones(1, 3))


# ---------------------------------------------------------------- TD loss


def test_soft_q_loss_hand_derived() -> None:
    # δ = [0.5 - 1, 3 - 1] = [-0.5, 2]; the third token is padding with a garbage Q.
    # squared: ½δ² = [0.125, 2] → token-mean 1.0625; Huber (d=1): [0.125, 1·(2 - 0.5)] → 0.8125.
    q = torch.tensor([[0.5, 3.0, GARBAGE]], requires_grad=True)
    targets, mask = torch.tensor([[1.0, 1.0, 0.0]]), torch.tensor([[1.0, 1.0, 0.0]])
    out = soft_q_loss(q, targets, mask)
    assert out.loss.item() == pytest.approx(1.0625)
    assert float(out.td_error_abs_mean) == pytest.approx(1.25)
    assert float(out.q_mean) == pytest.approx(1.75) and float(out.target_mean) == pytest.approx(1.0)
    assert soft_q_loss(q, targets, mask, td_loss="huber").loss.item() == pytest.approx(0.8125)
    out.loss.backward()  # ∂/∂Q = δ / 2 tokens
    assert q.grad is not None and q.grad.tolist() == [[-0.25, 1.0, 0.0]]


@pytest.mark.parametrize("seed", range(20))
def test_soft_q_loss_matches_loop(seed: int) -> None:
    b = make_batch(seed)
    targets = soft_bellman_targets(b.rewards, b.values, b.mask)
    modes: list[AggregationMode] = ["token-mean", "seq-mean-token-mean"]
    for mode in modes:
        loss = float(soft_q_loss(b.logp, targets, b.mask, mode).loss)
        per_row = [[0.5 * float(b.logp[i, t] - targets[i, t]) ** 2 for t in pos] for i, pos in enumerate(b.rows())]
        if mode == "token-mean":
            expected = sum(map(sum, per_row)) / max(sum(map(len, per_row)), 1)
        else:
            rows = [sum(r) / len(r) for r in per_row if r]
            expected = sum(rows) / max(len(rows), 1)
        assert loss == pytest.approx(expected)


def test_gradients_reach_only_q_taken_and_zero_masks_are_finite() -> None:
    # Targets built from values that require grad stay constants; an all-zero mask gives 0, not NaN.
    q = torch.randn(2, 3, requires_grad=True)
    v = torch.randn(2, 3, requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    soft_q_loss(q, soft_bellman_targets(torch.ones(2), v, mask), mask).loss.backward()
    assert v.grad is None and q.grad is not None and q.grad[1].abs().sum() == 0
    empty = soft_q_loss(torch.full((1, 2), float("nan"), requires_grad=True), torch.zeros(1, 2), torch.zeros(1, 2))
    assert empty.loss.item() == 0.0 and float(empty.td_error_abs_mean) == 0.0


# ---------------------------------------------------------------- temperature


def test_temperature_loss_gradient_sign() -> None:
    # H = 0.5 < target 1 → loss = -log α · (1 - 0.5); ∂/∂log α = -0.5 < 0 → a descent step raises α.
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    log_alpha = torch.tensor(math.log(2.0), requires_grad=True)
    entropy = torch.tensor([[0.5, 0.5, float("nan")]], requires_grad=True)  # NaN on padding must not leak
    loss = temperature_loss(log_alpha, entropy, mask, target_entropy=1.0)
    assert loss.item() == pytest.approx(-math.log(2.0) * 0.5)
    loss.backward()
    assert log_alpha.grad is not None and float(log_alpha.grad) == pytest.approx(-0.5)
    assert entropy.grad is None
    # H = 1.5 above target → positive gradient → α falls.
    up = torch.tensor(0.0, requires_grad=True)
    temperature_loss(up, torch.full((1, 3), 1.5), mask, 1.0).backward()
    assert up.grad is not None and float(up.grad) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="scalar"):
        temperature_loss(torch.zeros(1), entropy, mask, 1.0)


# ---------------------------------------------------------------- end to end on toy problems


def _fit(params: list[torch.Tensor], step_loss: Callable[[], torch.Tensor], steps: int = 300) -> None:
    opt = torch.optim.Adam(params, lr=0.05)
    for _ in range(steps):
        opt.zero_grad()
        step_loss().backward()
        opt.step()


def test_bandit_policy_moves_to_rewarded_action() -> None:
    # One row per action a ∈ {0, 1, 2}, rewards [1, 0, 0]. Layout: prompt (mask 0), the action, padding
    # (mask 0), so the reward must land on the masked position, not the row end. Fixed point: Q = [1, 0, 0]
    # → π = softmax(Q / 0.1) puts ≈ 1 on action 0. A flipped sign gives Q = [-1, 0, 0]; a misplaced reward
    # gives Q = [0, 0, 0] (π uniform): both fail.
    alpha, theta = 0.1, torch.zeros(3, requires_grad=True)
    mask = torch.tensor([[0.0, 1.0, 0.0]]).expand(3, 3)
    actions = torch.tensor([[0, 0, 0], [0, 1, 0], [0, 2, 0]])
    rewards = torch.tensor([1.0, 0.0, 0.0])

    def loss() -> torch.Tensor:
        logits = theta.expand(3, 3, 3)
        targets = soft_bellman_targets(rewards, soft_values(logits.detach(), alpha), mask)
        return soft_q_loss(taken_q_values(logits, actions), targets, mask).loss

    _fit([theta], loss)
    assert torch.allclose(theta.detach(), torch.tensor([1.0, 0.0, 0.0]), atol=0.02)
    assert float(torch.softmax(theta.detach() / alpha, -1)[0]) > 0.99


def test_two_step_credit_crosses_tool_output() -> None:
    # Action a at position 0, a tool-output token at 1 (mask 0, logits favour nothing), action b at 2;
    # reward 1 iff a = b = 0, all 9 pairs in the batch. Q0(a) must learn V(s1 | a) = α·lse(Q1[a] / α):
    # ≈ 1 for a = 0, α ln 3 ≈ 0.11 otherwise, so π0 prefers a = 0. Bootstrapping from the tool position
    # (constant V) would leave π0 uniform.
    alpha = 0.1
    theta0, theta1 = torch.zeros(3, requires_grad=True), torch.zeros(3, 3, requires_grad=True)
    pairs = [(a, b) for a in range(3) for b in range(3)]
    actions = torch.tensor([[a, 0, b] for a, b in pairs])
    rewards = torch.tensor([1.0 if (a, b) == (0, 0) else 0.0 for a, b in pairs])
    mask = torch.tensor([[1.0, 0.0, 1.0]]).expand(9, 3)

    def loss() -> torch.Tensor:
        first = theta0.expand(9, 3)
        logits = torch.stack([first, torch.zeros(9, 3), theta1[actions[:, 0]]], dim=1)
        targets = soft_bellman_targets(rewards, soft_values(logits.detach(), alpha), mask)
        return soft_q_loss(taken_q_values(logits, actions), targets, mask).loss

    _fit([theta0, theta1], loss, steps=400)
    assert float(theta0.detach()[0]) == pytest.approx(1.0, abs=0.05)
    assert float(theta0.detach()[1]) == pytest.approx(alpha * LN3, abs=0.05)
    assert float(torch.softmax(theta0.detach() / alpha, -1)[0]) > 0.99
