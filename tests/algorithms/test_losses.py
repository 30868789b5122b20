import math

import pytest
import torch
from algo_batches import make_batch

from harmonyrl.algorithms.kl import kl_k1, kl_k2, kl_k3
from harmonyrl.algorithms.losses import (
    AggregationMode,
    aggregate_loss,
    entropy_bonus,
    gspo_loss,
    masked_token_mean,
    policy_gradient_loss,
    ppo_clip_loss,
)

MODES: list[AggregationMode] = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


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


# ---------------------------------------------------------------- aggregation


def test_aggregation_hand_derived() -> None:
    # rows: [1, 2 | 3 masked out], [4 | 0, 0], [5, 5, 5 all masked out = empty row, not counted as a sequence]
    # token-mean = (1+2+4)/3 = 7/3; seq-mean-token-sum = (3 + 4)/2 = 3.5; seq-mean-token-mean = (1.5 + 4)/2
    # = 2.75; seq-mean-token-sum-norm (norm 4) = 3.5/4 = 0.875
    loss = torch.tensor([[1.0, 2, 3], [4, 0, 0], [5, 5, 5]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    got = [float(aggregate_loss(loss, mask, mode, norm=4.0)) for mode in MODES]
    assert got == pytest.approx([7 / 3, 3.5, 2.75, 0.875])
    assert float(aggregate_loss(loss, mask, "token-mean", denominator=7.0)) == pytest.approx(1.0)
    assert float(aggregate_loss(loss, mask, "seq-mean-token-sum", denominator=7.0)) == pytest.approx(1.0)
    for mode in MODES:
        assert float(aggregate_loss(loss, torch.zeros(3, 3), mode, norm=4.0)) == 0.0
    with pytest.raises(ValueError, match="norm"):
        aggregate_loss(loss, mask, "seq-mean-token-sum-norm")


def _loop_aggregate(loss: torch.Tensor, mask: torch.Tensor, mode: AggregationMode, norm: float) -> float:
    rows = [[float(loss[i, j]) for j in range(mask.shape[1]) if mask[i, j] > 0] for i in range(mask.shape[0])]
    rows = [r for r in rows if r]
    if not rows:
        return 0.0
    if mode == "token-mean":
        return sum(sum(r) for r in rows) / sum(len(r) for r in rows)
    if mode == "seq-mean-token-mean":
        return sum(sum(r) / len(r) for r in rows) / len(rows)
    scale = norm if mode == "seq-mean-token-sum-norm" else 1.0
    return sum(sum(r) for r in rows) / len(rows) / scale


@pytest.mark.parametrize("seed", range(40))
def test_aggregation_matches_loop(seed: int) -> None:
    b = make_batch(seed)
    for mode in MODES:
        got = float(aggregate_loss(b.token_adv, b.mask, mode, norm=8.0))
        assert math.isclose(got, _loop_aggregate(b.token_adv, b.mask, mode, 8.0), rel_tol=1e-9, abs_tol=1e-12)


# ---------------------------------------------------------------- PPO dual-clip


def test_dual_clip_hand_derived() -> None:
    # bounds [0.8, 1.2], c = 2. t0: ρ=3, A=-1: min(-3, -1.2) = -3, max(-3, c·A = -2) = -2 → loss 2 (dual active)
    # t1: ρ=0.5, A=-1: min(-0.5, -0.8) = -0.8 > -2 → 0.8;  t2: ρ=3, A=+1: min(3, 1.2) → -1.2 (dual n/a)
    # token-mean (2 + 0.8 - 1.2)/3 = 1.6/3; without dual-clip t0 gives 3 → (3 + 0.8 - 1.2)/3 = 2.6/3
    logp = torch.log(torch.tensor([[3.0, 0.5, 3.0]])).requires_grad_(True)
    adv, mask = torch.tensor([[-1.0, -1.0, 1.0]]), torch.ones(1, 3)
    out = ppo_clip_loss(logp, torch.zeros(1, 3), adv, mask, 0.2, 0.2, dual_clip=2.0)
    assert float(out.loss.detach()) == pytest.approx(1.6 / 3)
    assert float(out.dual_clip_fraction) == pytest.approx(1 / 3)
    assert float(out.clip_fraction) == pytest.approx(2 / 3)  # t1 and t2 took the clipped branch
    out.loss.backward()
    assert logp.grad is not None and logp.grad.tolist() == [[0.0, 0.0, 0.0]]  # all three on flat branches
    plain = ppo_clip_loss(logp.detach(), torch.zeros(1, 3), adv, mask, 0.2, 0.2)
    assert float(plain.loss) == pytest.approx(2.6 / 3)
    with pytest.raises(ValueError):
        ppo_clip_loss(logp.detach(), torch.zeros(1, 3), adv, mask, 0.2, 0.2, dual_clip=1.0)


@pytest.mark.parametrize("seed", range(40))
def test_ppo_dual_clip_matches_loop(seed: int) -> None:
    b = make_batch(seed)
    lo, hi, c = 0.2, 0.28, 3.0
    out = ppo_clip_loss(b.logp, b.old_logp, b.token_adv, b.mask, lo, hi, dual_clip=c, aggregation="seq-mean-token-mean")
    per_row = []
    for i, pos in enumerate(b.rows()):
        terms = []
        for j in pos:
            rho, a = math.exp(float(b.logp[i, j] - b.old_logp[i, j])), float(b.token_adv[i, j])
            obj = min(rho * a, min(max(rho, 1 - lo), 1 + hi) * a)
            terms.append(-(max(obj, c * a) if a < 0 else obj))
        if terms:
            per_row.append(sum(terms) / len(terms))
    expected = sum(per_row) / len(per_row) if per_row else 0.0
    assert math.isclose(float(out.loss), expected, rel_tol=1e-9, abs_tol=1e-12)


# ---------------------------------------------------------------- GSPO


def test_gspo_hand_derived() -> None:
    # seq 0: log-ratios [ln 2, 0] → s = exp(ln2 / 2) = √2 ≈ 1.414, A = 1 → clipped at 1.2 → -1.2 per token
    # seq 1: one token, ratio 0.9, A = -2 → -(0.9·-2) = 1.8 (inside [0.8, 1.2]); t2 of seq 1 is padding
    # seq-mean-token-mean = (-1.2 + 1.8)/2 = 0.3; clip fraction 2/3 tokens; max |s - 1| = √2 - 1
    logp = torch.log(torch.tensor([[2.0, 1.0, 1.0], [0.9, 50.0, 50.0]]))
    adv = torch.tensor([[1.0, 1.0, 0.0], [-2.0, -2.0, -2.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    out = gspo_loss(logp, torch.zeros(2, 3), adv, mask, 0.2, 0.2)
    assert float(out.loss) == pytest.approx(0.3)
    assert float(out.clip_fraction) == pytest.approx(2 / 3)
    assert float(out.ratio_max_dev) == pytest.approx(math.sqrt(2) - 1, rel=1e-6)


@pytest.mark.parametrize("seed", range(40))
def test_gspo_matches_sequence_objective_with_gradient(seed: int) -> None:
    # GSPO-token must equal GSPO's sequence objective -(1/|S|) Σ_i min(s_i A_i, clip(s_i) A_i), value and gradient
    b = make_batch(seed)
    adv_seq = b.token_adv[:, 0].clone()
    adv = adv_seq[:, None].expand_as(b.mask)
    lo, hi = 0.05, 0.1
    logp = b.logp.clone().requires_grad_(True)
    out = gspo_loss(logp, b.old_logp, adv, b.mask, lo, hi)
    logp_ref = b.logp.clone().requires_grad_(True)
    objs = []
    for i, pos in enumerate(b.rows()):
        if pos:
            s = torch.exp(sum(logp_ref[i, j] - b.old_logp[i, j] for j in pos) / len(pos))
            objs.append(torch.minimum(s * adv_seq[i], s.clamp(1 - lo, 1 + hi) * adv_seq[i]))
    expected = -torch.stack(objs).mean() if objs else torch.zeros((), dtype=torch.float64)
    assert math.isclose(float(out.loss.detach()), float(expected.detach()), rel_tol=1e-9, abs_tol=1e-12)
    if objs:
        out.loss.backward()
        expected.backward()
        assert logp.grad is not None and logp_ref.grad is not None
        assert torch.allclose(logp.grad, logp_ref.grad, atol=1e-12)


def test_gspo_on_policy_ratio_is_exactly_one() -> None:
    logp = torch.tensor([[-1.3, -0.2, -4.0]])
    out = gspo_loss(logp, logp.clone(), torch.ones(1, 3), torch.ones(1, 3), 3e-4, 4e-4)
    assert float(out.ratio_max_dev) == 0.0 and float(out.clip_fraction) == 0.0


# ---------------------------------------------------------------- policy gradient, entropy, weights


def test_policy_gradient_hand_derived() -> None:
    # per token -A·logp: -(2·-1) = 2, -(-1·-2) = -2, t2 masked → mean 0; gradient -A/2 = [-1, 0.5, 0]
    logp = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    out = policy_gradient_loss(logp, torch.tensor([[2.0, -1.0, 5.0]]), torch.tensor([[1.0, 1.0, 0.0]]))
    out.loss.backward()
    assert float(out.loss.detach()) == 0.0
    assert logp.grad is not None and logp.grad.tolist() == [[-1.0, 0.5, 0.0]]


@pytest.mark.parametrize("seed", range(40))
def test_policy_gradient_and_entropy_match_loop(seed: int) -> None:
    b = make_batch(seed)
    w = torch.rand(b.mask.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    pg = policy_gradient_loss(b.logp, b.token_adv, b.mask, weights=w, aggregation="seq-mean-token-sum")
    ent = entropy_bonus(-b.logp, b.mask, 0.01)
    rows = [[(i, j) for j in pos] for i, pos in enumerate(b.rows()) if pos]
    n_tok = sum(len(r) for r in rows)
    pg_expected = sum(sum(-float(w[i, j] * b.token_adv[i, j] * b.logp[i, j]) for i, j in r) for r in rows) / max(
        len(rows), 1
    )
    ent_expected = -0.01 * sum(-float(b.logp[i, j]) for r in rows for i, j in r) / max(n_tok, 1)
    assert math.isclose(float(pg.loss), pg_expected, rel_tol=1e-9, abs_tol=1e-12)
    assert math.isclose(float(ent), ent_expected, rel_tol=1e-9, abs_tol=1e-12)


def test_entropy_bonus_hand_derived() -> None:
    # token-mean of H = (1 + 3)/2 = 2 → -0.1 · 2 = -0.2 (minimising raises entropy)
    assert float(entropy_bonus(torch.tensor([[1.0, 3.0, 9.0]]), torch.tensor([[1, 1, 0]]), 0.1)) == pytest.approx(-0.2)


def test_weights_scale_ppo_token_loss() -> None:
    # on-policy, A = [1, 1], weights [2, 0] → per token -ρ·A·w = [-2, 0] → token-mean -1
    logp = torch.tensor([[-0.5, -0.7]])
    out = ppo_clip_loss(logp, logp, torch.ones(1, 2), torch.ones(1, 2), 0.2, 0.2, weights=torch.tensor([[2.0, 0.0]]))
    assert float(out.loss) == -1.0
