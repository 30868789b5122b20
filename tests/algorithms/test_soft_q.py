import math
from collections.abc import Callable

import pytest
import torch
from algo_batches import GARBAGE, make_batch

from harmonyrl.algorithms.losses import AggregationMode
from harmonyrl.algorithms.soft_q import kl_k3, log_ratio, nth_next_sampled_index, soft_n_step_targets, soft_q_loss

E2 = math.exp(2.0)

# ---------------------------------------------------------------- log-ratio and KL


def test_log_ratio_and_k3_hand_derived() -> None:
    # ℓ = [-1 - (-1.5), -2 - (-1)] = [0.5, -1]; the padding position (garbage) is 0.
    lp = torch.tensor([[-1.0, -2.0, GARBAGE]], requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0, GARBAGE]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    ratio = log_ratio(lp, ref, mask)
    assert ratio.tolist() == [[0.5, -1.0, 0.0]]
    ratio.sum().backward()
    assert ref.grad is None and lp.grad is not None and lp.grad.tolist() == [[1.0, 1.0, 0.0]]
    # k3 of ℓ = [0, ln 2]: [0, 1/2 - 1 + ln 2] → mean (ln 2 - 1/2) / 2
    k3 = kl_k3(torch.tensor([[0.0, math.log(2.0), GARBAGE]]), mask)
    assert float(k3) == pytest.approx((math.log(2.0) - 0.5) / 2)


# ---------------------------------------------------------------- n-th next sampled index


def _loop_nth(mask_row: list[float], n: int) -> list[int]:
    out = []
    for t, m in enumerate(mask_row):
        later = [j for j in range(t + 1, len(mask_row)) if mask_row[j] > 0]
        out.append(later[n - 1] if m > 0 and len(later) >= n else -1)
    return out


def test_nth_next_index_hand_derived() -> None:
    # prompt, two sampled tokens, two tool-output tokens, one sampled token, padding
    mask = torch.tensor([[0, 1, 1, 0, 0, 1, 0], [1, 1, 1, 1, 1, 1, 1], [0] * 7])
    assert nth_next_sampled_index(mask, 1).tolist() == [[-1, 2, 5, -1, -1, -1, -1], [1, 2, 3, 4, 5, 6, -1], [-1] * 7]
    assert nth_next_sampled_index(mask, 2).tolist() == [[-1, 5, -1, -1, -1, -1, -1], [2, 3, 4, 5, 6, -1, -1], [-1] * 7]
    assert nth_next_sampled_index(mask, 7).tolist() == [[-1] * 7] * 3
    with pytest.raises(ValueError, match="n must be"):
        nth_next_sampled_index(mask, 0)


@pytest.mark.parametrize("seed", range(30))
def test_nth_next_index_matches_loop(seed: int) -> None:
    b = make_batch(seed)  # padding, tool-output holes, zero-length rows, sometimes B = 1
    for n in (1, 2, 3):
        got = nth_next_sampled_index(b.mask, n)
        assert [got[i].tolist() for i in range(b.mask.shape[0])] == [_loop_nth(r, n) for r in b.mask.tolist()]


# ---------------------------------------------------------------- targets


def test_targets_hand_derived() -> None:
    # mask [1, 1, 1], ℓ = [0.1, 0.2, 0.4], α = 0.5, reward 1.
    # Monte Carlo: y_t = 1 - α Σ_{j>t} ℓ_j = [1 - 0.5·0.6, 1 - 0.5·0.4, 1] = [0.7, 0.8, 1].
    # horizon 1, V̄ = [9, 0.3, 0.6]: y = [V̄_1, V̄_2, reward] = [0.3, 0.6, 1] (nothing strictly between).
    # horizon 2: y_0 = V̄_2 - α ℓ_1 = 0.6 - 0.1 = 0.5; y_1 = 1 - α ℓ_2 = 0.8 (no 2nd token after it); y_2 = 1.
    mask = torch.ones(1, 3, dtype=torch.float64)
    ratio = torch.tensor([[0.1, 0.2, 0.4]], dtype=torch.float64)
    vbar, r = torch.tensor([[9.0, 0.3, 0.6]], dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64)
    assert soft_n_step_targets(r, ratio, vbar, mask, 0.5, None)[0].tolist() == pytest.approx([0.7, 0.8, 1.0])
    assert soft_n_step_targets(r, ratio, vbar, mask, 0.5, 1)[0].tolist() == pytest.approx([0.3, 0.6, 1.0])
    assert soft_n_step_targets(r, ratio, vbar, mask, 0.5, 2)[0].tolist() == pytest.approx([0.5, 0.8, 1.0])
    # Tool output (mask 0, garbage ℓ and V̄) is skipped: prompt, a, b, tool, tool, c, padding; reward 0.5,
    # ℓ_a = 0.2, ℓ_b = -0.4, ℓ_c = 1, α = 0.5. MC: y_a = 0.5 - 0.5(-0.4 + 1) = 0.2, y_b = 0.5 - 0.5 = 0,
    # y_c = 0.5. horizon 1, V̄_b = 0.3, V̄_c = 0.7: [0.3, 0.7, 0.5].
    mask = torch.tensor([[0, 1, 1, 0, 0, 1, 0]], dtype=torch.float64)
    g = GARBAGE
    ratio = torch.tensor([[g, 0.2, -0.4, g, g, 1.0, g]], dtype=torch.float64)
    vbar = torch.tensor([[g, g, 0.3, g, g, 0.7, g]], dtype=torch.float64)
    r = torch.tensor([0.5], dtype=torch.float64)
    assert soft_n_step_targets(r, ratio, vbar, mask, 0.5, None)[0].tolist() == pytest.approx([0, 0.2, 0, 0, 0, 0.5, 0])
    assert soft_n_step_targets(r, ratio, vbar, mask, 0.5, 1)[0].tolist() == pytest.approx([0, 0.3, 0.7, 0, 0, 0.5, 0])


def _loop_targets(b: object, alpha: float, horizon: int | None) -> list[list[float]]:
    mask, ratio, vbar, rewards = b.mask, b.logp, b.values, b.rewards  # type: ignore[attr-defined]
    out = []
    for i, row in enumerate(mask.tolist()):
        pos = [j for j, m in enumerate(row) if m > 0]
        ys = [0.0] * len(row)
        for k, t in enumerate(pos):
            ahead = pos[k + 1 :] if horizon is None else pos[k + 1 : k + 1 + horizon]
            boot = horizon is not None and len(ahead) == horizon
            between = ahead[:-1] if boot else ahead
            tail = float(vbar[i, ahead[-1]]) if boot else float(rewards[i])
            ys[t] = tail - alpha * sum(float(ratio[i, j]) for j in between)
        out.append(ys)
    return out


@pytest.mark.parametrize("seed", range(30))
def test_targets_match_loop(seed: int) -> None:
    b = make_batch(seed)
    alpha = [0.1, 0.5, 1.0][seed % 3]
    for horizon in (None, 1, 2, 4):
        got = soft_n_step_targets(b.rewards, b.logp, b.values, b.mask, alpha, horizon)
        assert got.flatten().tolist() == pytest.approx([y for row in _loop_targets(b, alpha, horizon) for y in row])


def test_targets_detach_and_check_inputs() -> None:
    v = torch.ones(1, 3, requires_grad=True)
    out = soft_n_step_targets(torch.ones(1), v, v, torch.ones(1, 3), 0.5, 1)
    assert not out.requires_grad
    with pytest.raises(ValueError, match=r"\[B\]"):
        soft_n_step_targets(torch.ones(1, 1), v, v, torch.ones(1, 3), 0.5, 1)
    with pytest.raises(ValueError, match="alpha"):
        soft_n_step_targets(torch.ones(1), v, v, torch.ones(1, 3), 0.0, 1)


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
    targets = soft_n_step_targets(b.rewards, b.logp, b.values, b.mask, 0.5, 2)
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
    soft_q_loss(q, soft_n_step_targets(torch.ones(2), v, v, mask, 0.5, 1), mask).loss.backward()
    assert v.grad is None and q.grad is not None and q.grad[1].abs().sum() == 0
    empty = soft_q_loss(torch.full((1, 2), float("nan"), requires_grad=True), torch.zeros(1, 2), torch.zeros(1, 2))
    assert empty.loss.item() == 0.0 and float(empty.td_error_abs_mean) == 0.0


# ---------------------------------------------------------------- end to end on toy problems


def _fit(params: list[torch.Tensor], step_loss: Callable[[], torch.Tensor], steps: int = 600) -> None:
    opt = torch.optim.Adam(params, lr=0.05)
    for _ in range(steps):
        opt.zero_grad()
        step_loss().backward()
        opt.step()


def test_bandit_converges_to_the_tilted_warm_start_off_policy() -> None:
    # One episode per action a ∈ {0, 1, 2} (a uniform behaviour policy, not π), rewards [1, 0, 0], π_ref
    # uniform, α = 0.5. Zero residual for every a: α(log π(a) - log ⅓) + V = r(a), so π(a) = ⅓ exp((r(a) - V)/α)
    # and Σ π = 1 gives V = α ln((e² + 2)/3), π = [e², 1, 1] / (e² + 2) = [0.787, 0.107, 0.107] — the warm start
    # tilted by exp(r/α), not the max-entropy (uniform) nor the greedy one-hot policy.
    alpha, theta, v = 0.5, torch.zeros(3, requires_grad=True), torch.zeros((), requires_grad=True)
    mask = torch.tensor([[0.0, 1.0, 0.0]]).expand(3, 3)  # prompt, the action, padding
    actions, rewards = torch.arange(3), torch.tensor([1.0, 0.0, 0.0])
    ref = torch.full((3, 3), math.log(1 / 3))

    def loss() -> torch.Tensor:
        logp = torch.zeros(3, 3).index_put((torch.arange(3), torch.ones(3, dtype=torch.long)),
                                           torch.log_softmax(theta, -1)[actions])  # fmt: skip
        ratio = log_ratio(logp, ref, mask)
        values = v.expand(3, 3)
        targets = soft_n_step_targets(rewards, ratio, values, mask, alpha, 1)
        return soft_q_loss(alpha * ratio + values, targets, mask).loss

    _fit([theta, v], loss)
    assert torch.softmax(theta.detach(), -1).tolist() == pytest.approx([E2 / (E2 + 2), 1 / (E2 + 2), 1 / (E2 + 2)],
                                                                       abs=1e-3)  # fmt: skip
    assert float(v.detach()) == pytest.approx(alpha * math.log((E2 + 2) / 3), abs=1e-3)


@pytest.mark.parametrize("horizon", [1, None])
def test_two_step_fixed_point_crosses_tool_output(horizon: int | None) -> None:
    # Action a at position 0, a tool-output token at 1 (mask 0, garbage ℓ and V), action b at 2; reward 1 iff
    # a = b = 0; all 9 pairs, π_ref uniform, α = 0.5. The soft-optimal solution, derived by hand:
    #   second step: π(·|a=0) ∝ exp(r/α) = [e², 1, 1] (logits [2, 0, 0]), V(s1|0) = α ln((e² + 2)/3) =: α ln L;
    #                π(·|a≠0) uniform, V(s1|a≠0) = 0;
    #   first step:  π0 ∝ exp(V(s1|a)/α) = [L, 1, 1] (logits [ln L, 0, 0]), V(s0) = α ln((L + 2)/3).
    # Every residual is 0 there, with bootstrapping (horizon 1, V̄ = V) and with Monte Carlo targets alike; a
    # target read at the tool position (garbage) or a wrong sign would leave a residual.
    alpha, lift = 0.5, (E2 + 2) / 3
    th0 = torch.tensor([math.log(lift), 0.0, 0.0], dtype=torch.float64)
    th1 = torch.tensor([[2.0, 0.0, 0.0], [0.0] * 3, [0.0] * 3], dtype=torch.float64)
    v0, v1 = alpha * math.log((lift + 2) / 3), torch.tensor([alpha * math.log(lift), 0, 0], dtype=torch.float64)
    pairs = [(a, b) for a in range(3) for b in range(3)]
    a_ids, b_ids = torch.tensor([a for a, _ in pairs]), torch.tensor([b for _, b in pairs])
    mask = torch.tensor([[1.0, 0.0, 1.0]], dtype=torch.float64).expand(9, 3)
    ref = torch.full((9, 3), math.log(1 / 3), dtype=torch.float64)
    garbage = torch.full((9,), GARBAGE, dtype=torch.float64)

    def residual_loss(rewards: torch.Tensor) -> float:
        lp_a = torch.log_softmax(th0, -1)[a_ids]
        lp_b = torch.log_softmax(th1[a_ids], -1).gather(1, b_ids[:, None])[:, 0]
        ratio = log_ratio(torch.stack([lp_a, garbage, lp_b], 1), ref, mask)
        values = torch.stack([torch.full((9,), v0, dtype=torch.float64), garbage, v1[a_ids]], 1)
        targets = soft_n_step_targets(rewards, ratio, values, mask, alpha, horizon)
        return float(soft_q_loss(alpha * ratio + values, targets, mask).loss)

    rewards = torch.tensor([1.0 if (a, b) == (0, 0) else 0.0 for a, b in pairs], dtype=torch.float64)
    assert residual_loss(rewards) == pytest.approx(0.0, abs=1e-20)
    assert residual_loss(rewards.flip(0)) > 0.01  # the same parameters are not optimal for another reward
