import math

import pytest
import torch
from algo_batches import batch_with_sampled_token, make_batch, pick_sampled_token
from pydantic import ValidationError

from harmonyrl.algorithms.correction import (
    MaskedIS,
    Rejection,
    RolloutCorrectionConfig,
    TruncatedIS,
    WeightLevel,
    apply_correction,
    importance_weights,
    rejection_keep_mask,
    resolve_old_logp,
)

LN2 = math.log(2)
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0]])


def _trainer_sampler() -> tuple[torch.Tensor, torch.Tensor]:
    # per-token ratio trainer/sampler = [0.5/0.25, 0.5/0.5, 0.2/0.4] = [2, 1, 0.5]; position 3 is padding
    trainer = torch.log(torch.tensor([[0.5, 0.5, 0.2, 0.9]]))
    sampler = torch.log(torch.tensor([[0.25, 0.5, 0.4, 0.1]]))
    return trainer, sampler


def test_weight_levels_hand_derived() -> None:
    # token [2, 1, 0.5]; sequence = product = 1; geometric = 1^(1/3) = 1; padding weight 0
    t, s = _trainer_sampler()
    assert torch.allclose(importance_weights(t, s, MASK, "token"), torch.tensor([[2.0, 1.0, 0.5, 0.0]]))
    assert torch.allclose(importance_weights(t, s, MASK, "sequence"), torch.tensor([[1.0, 1.0, 1.0, 0.0]]))
    # drop the last token: sequence = 2·1 = 2, geometric = 2^(1/2) = 1.414214
    m2 = torch.tensor([[1.0, 1.0, 0.0, 0.0]])
    assert torch.allclose(importance_weights(t, s, m2, "sequence"), torch.tensor([[2.0, 2.0, 0.0, 0.0]]))
    assert torch.allclose(importance_weights(t, s, m2, "geometric"), torch.tensor([[1.414214, 1.414214, 0, 0]]))


def test_truncated_and_masked_hand_derived() -> None:
    t, s = _trainer_sampler()
    # TIS high 1.5: [min(2,1.5), 1, 0.5] = [1.5, 1, 0.5], 1 of 3 truncated
    out = apply_correction(t, s, MASK, RolloutCorrectionConfig(weights=TruncatedIS(high=1.5)))
    assert torch.allclose(out.weights, torch.tensor([[1.5, 1.0, 0.5, 0.0]]))
    assert float(out.truncated_fraction) == pytest.approx(1 / 3) and float(out.masked_fraction) == 0.0
    # TIS high 10 + normalize: mean of [2, 1, 0.5] = 7/6 → [12/7, 6/7, 3/7]
    out = apply_correction(t, s, MASK, RolloutCorrectionConfig(weights=TruncatedIS(high=10.0, normalize=True)))
    assert torch.allclose(out.weights, torch.tensor([[12 / 7, 6 / 7, 3 / 7, 0.0]]))
    # MIS [0.6, 1.5]: 2 and 0.5 fall outside → [0, 1, 0]; 2 of 3 masked; the loss mask is unchanged
    out = apply_correction(t, s, MASK, RolloutCorrectionConfig(weights=MaskedIS(low=0.6, high=1.5)))
    assert torch.allclose(out.weights, torch.tensor([[0.0, 1.0, 0.0, 0.0]]))
    assert float(out.masked_fraction) == pytest.approx(2 / 3) and torch.equal(out.loss_mask, MASK)


def test_rejection_hand_derived() -> None:
    t, s = _trainer_sampler()
    # token k1 = sampler - trainer = [-ln2, 0, ln2]; |k1| > 0.5 rejects t0 and t2 → keep [0, 1, 0]
    out = apply_correction(t, s, MASK, RolloutCorrectionConfig(rejection=Rejection(estimator="k1", threshold=0.5)))
    assert out.loss_mask.tolist() == [[0.0, 1.0, 0.0, 0.0]] and out.weights.tolist() == [[0.0, 1.0, 0.0, 0.0]]
    assert float(out.rejected_token_fraction) == pytest.approx(2 / 3) and float(out.rejected_seq_fraction) == 0.0
    # sequence k1 mean = (-ln2 + 0 + ln2)/3 = 0 → kept
    seq_k1 = Rejection(level="sequence", estimator="k1", threshold=0.1)
    assert rejection_keep_mask(t, s, MASK, seq_k1).tolist() == [[True, True, True, False]]
    # sequence k3 with r = w: [2 - 1 - ln2, 0, 0.5 - 1 + ln2], mean = 0.5/3 = 0.1667 > 0.1 → sequence rejected
    out = apply_correction(t, s, MASK, RolloutCorrectionConfig(rejection=Rejection(level="sequence", threshold=0.1)))
    assert out.loss_mask.sum() == 0 and float(out.rejected_seq_fraction) == 1.0
    assert float(out.rejected_token_fraction) == 1.0


def test_config_is_typed_and_frozen() -> None:
    cfg = RolloutCorrectionConfig.model_validate(
        {"weights": {"mode": "mask", "level": "geometric", "low": 0.9, "high": 1.1}, "rejection": {"threshold": 1.0}}
    )
    assert isinstance(cfg.weights, MaskedIS) and cfg.weights.level == "geometric"
    assert isinstance(RolloutCorrectionConfig.model_validate({"weights": {"mode": "truncate"}}).weights, TruncatedIS)
    with pytest.raises(ValidationError):
        MaskedIS(low=2.0, high=1.0)
    with pytest.raises(ValidationError):
        RolloutCorrectionConfig.model_validate({"weights": {"mode": "truncate", "low": 0.5}})  # TIS has no low
    with pytest.raises(ValidationError):
        cfg.bypass = True  # type: ignore[misc]


def test_bypass_uses_sampler_logp() -> None:
    s, t = torch.tensor([[-1.0]]), torch.tensor([[-2.0]])
    assert resolve_old_logp(s, t, RolloutCorrectionConfig(bypass=True)) is not t
    assert float(resolve_old_logp(s, t, RolloutCorrectionConfig(bypass=True))) == -1.0
    assert float(resolve_old_logp(s, t, RolloutCorrectionConfig())) == -2.0
    with pytest.raises(ValueError):
        resolve_old_logp(s, None, RolloutCorrectionConfig())


CONFIGS = [
    RolloutCorrectionConfig(rejection=Rejection(threshold=0.05)),
    RolloutCorrectionConfig(weights=TruncatedIS(high=1.2)),
    RolloutCorrectionConfig(weights=TruncatedIS(level="sequence", high=1.5, normalize=True)),
    RolloutCorrectionConfig(weights=MaskedIS(level="geometric", low=0.8, high=1.2)),
    RolloutCorrectionConfig(
        weights=MaskedIS(low=0.7, high=1.3, normalize=True), rejection=Rejection(level="sequence", threshold=0.05)
    ),
    RolloutCorrectionConfig(
        weights=TruncatedIS(level="geometric", high=1.1), rejection=Rejection(estimator="k1", threshold=0.3)
    ),
    RolloutCorrectionConfig(
        weights=TruncatedIS(high=2.0), rejection=Rejection(level="sequence", estimator="k2", threshold=0.04)
    ),
]


def _kl(est: str, s: float, t: float) -> float:
    lr = t - s  # log r with r = trainer / sampler
    return {"k1": -lr, "k2": 0.5 * lr * lr, "k3": math.exp(lr) - 1 - lr}[est]


def _loop_keep(rows: list[list[int]], t: torch.Tensor, s: torch.Tensor, rej: Rejection | None) -> set[tuple[int, int]]:
    keep = set()
    for i, pos in enumerate(rows):
        kls = [_kl(rej.estimator, float(s[i, j]), float(t[i, j])) for j in pos] if rej else [0.0] * len(pos)
        seq_ok = not pos or abs(sum(kls) / len(pos)) <= (rej.threshold if rej else math.inf)
        for j, kl in zip(pos, kls, strict=True):
            ok = seq_ok if (rej and rej.level == "sequence") else (rej is None or abs(kl) <= rej.threshold)
            if ok:
                keep.add((i, j))
    return keep


def _loop_log_weight(level: WeightLevel, lrs: list[float], k: int) -> float:
    raw = {"token": lrs[k], "sequence": sum(lrs), "geometric": sum(lrs) / len(lrs)}[level]
    return min(max(raw, -20.0), 20.0)


@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("seed", range(25))
def test_correction_matches_loop(seed: int, cfg: RolloutCorrectionConfig) -> None:
    b = make_batch(seed)
    t, s = b.old_logp, b.sampler_logp
    out = apply_correction(t, s, b.mask, cfg)
    rows = b.rows()
    keep = _loop_keep(rows, t, s, cfg.rejection)
    expected = torch.zeros_like(b.mask)
    flagged = 0
    for i, pos in enumerate(rows):
        lrs = [float(t[i, j] - s[i, j]) for j in pos]
        for k, j in enumerate(pos):
            w = 1.0
            if cfg.weights is not None:
                w = math.exp(_loop_log_weight(cfg.weights.level, lrs, k))
                low = cfg.weights.low if isinstance(cfg.weights, MaskedIS) else 0.0
                outside = w > cfg.weights.high or w < low
                flagged += outside
                w = min(w, cfg.weights.high) if isinstance(cfg.weights, TruncatedIS) else w * (not outside)
            expected[i, j] = w if (i, j) in keep else 0.0
    if cfg.weights is not None and cfg.weights.normalize and keep:
        mean = float(expected.sum()) / len(keep)
        expected = expected / mean if mean > 0 else expected
    n_tok = sum(len(p) for p in rows)
    assert torch.allclose(out.weights, expected, atol=1e-10)
    assert out.loss_mask.tolist() == [[float((i, j) in keep) for j in range(b.mask.shape[1])] for i in range(len(rows))]
    frac = float(out.truncated_fraction + out.masked_fraction)
    assert math.isclose(frac, flagged / max(n_tok, 1), abs_tol=1e-6)
    assert math.isclose(float(out.rejected_token_fraction), (n_tok - len(keep)) / max(n_tok, 1), abs_tol=1e-6)
    assert torch.isfinite(out.weights).all()


@pytest.mark.parametrize("seed", range(40))
def test_shifting_sampler_logp_moves_weights_exactly(seed: int) -> None:
    b = batch_with_sampled_token(seed)
    rows = b.rows()
    i, j = pick_sampled_token(rows, seed)
    pos = rows[i]
    t, s = b.old_logp, b.sampler_logp
    s2 = s.clone()
    s2[i, j] -= LN2  # the sampler now gives this token half the probability → its weight doubles
    for level, factor in (("token", 2.0), ("sequence", 2.0), ("geometric", 2.0 ** (1 / len(pos)))):
        before = importance_weights(t, s, b.mask, level)
        after = importance_weights(t, s2, b.mask, level)
        ratio = torch.where(b.mask > 0, after / before, torch.ones_like(after))
        moved = torch.zeros_like(ratio, dtype=torch.bool)
        if level == "token":
            moved[i, j] = True
        else:
            moved[i] = b.mask[i] > 0
        assert torch.allclose(ratio[moved], torch.full_like(ratio[moved], factor), rtol=1e-12)
        assert torch.equal(after[~moved], before[~moved])
    # TIS with the clamp between w and 2w: this token (and no other) becomes truncated
    w = float(importance_weights(t, s, b.mask, "token")[i, j])
    cfg = RolloutCorrectionConfig(weights=TruncatedIS(high=1.5 * w))
    delta = float(apply_correction(t, s2, b.mask, cfg).truncated_fraction) - float(
        apply_correction(t, s, b.mask, cfg).truncated_fraction
    )
    assert math.isclose(delta, 1 / sum(len(p) for p in rows), rel_tol=1e-6)
