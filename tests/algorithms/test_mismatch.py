import math

import pytest
import torch
from algo_batches import batch_with_sampled_token, make_batch, pick_sampled_token

from harmonyrl.algorithms.correction import Rejection, RolloutCorrectionConfig, TruncatedIS, apply_correction
from harmonyrl.algorithms.mismatch import chi2_and_ess, mismatch_metrics

LN2 = math.log(2)


def test_mismatch_hand_derived() -> None:
    # row 0: w = trainer/sampler = [2, 1, 0.5]; row 1: one token, w = 2; row 2: empty (ignored everywhere).
    # tokens w = [2, 1, 0.5, 2]: Σw = 5.5, Σw² = 9.25 → χ²_tok = 9.25/4 - 1 = 1.3125, ESS = 5.5²/(4·9.25) = 0.817568
    # k1 = mean(sampler - trainer) = -(ln2 + 0 - ln2 + ln2)/4 = -ln2/4
    # k3 = mean(w - 1 - ln w) = (1 - ln2 + 0 + ln2 - 0.5 + 1 - ln2)/4 = (1.5 - ln2)/4
    # log-ppl diff per row = mean(sampler - trainer) = [0, -ln2] → mean -ln2/2, |·| ln2/2, max 0, min -ln2
    # ppl ratio = mean(exp(0), exp(-ln2)) = 0.75; sequence W = [1, 2] → χ²_seq = 5/2 - 1 = 1.5, ESS = 9/10
    trainer = torch.log(torch.tensor([[0.5, 0.5, 0.2], [0.5, 0.3, 0.3], [0.1, 0.1, 0.1]]))
    sampler = torch.log(torch.tensor([[0.25, 0.5, 0.4], [0.25, 0.9, 0.9], [0.7, 0.7, 0.7]]))
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])
    got = mismatch_metrics(trainer, sampler, mask)
    expected = {
        "kl_k1": -LN2 / 4,
        "kl_k3": (1.5 - LN2) / 4,
        "log_ppl_diff_mean": -LN2 / 2,
        "log_ppl_diff_abs_mean": LN2 / 2,
        "log_ppl_diff_max": 0.0,
        "log_ppl_diff_min": -LN2,
        "ppl_ratio": 0.75,
        "chi2_token": 1.3125,
        "chi2_seq": 1.5,
        "ess_token": 5.5**2 / (4 * 9.25),
        "ess_seq": 0.9,
        "max_abs_logprob_diff": LN2,
    }
    assert set(got) == {"mismatch/" + k for k in expected}
    for k, v in expected.items():
        assert got["mismatch/" + k] == pytest.approx(v, abs=1e-6), k


def test_empty_batch_is_finite() -> None:
    got = mismatch_metrics(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3))
    assert all(math.isfinite(v) for v in got.values())
    assert got["mismatch/ess_token"] == 1.0 and got["mismatch/chi2_token"] == 0.0
    assert chi2_and_ess(torch.zeros(3), torch.ones(3, dtype=torch.bool)) == (-1.0, 1.0)


def test_fractions_come_from_the_correction() -> None:
    t = torch.log(torch.tensor([[0.5, 0.5, 0.2]]))
    s = torch.log(torch.tensor([[0.25, 0.5, 0.4]]))
    mask = torch.ones(1, 3)
    cfg = RolloutCorrectionConfig(weights=TruncatedIS(high=1.5), rejection=Rejection(estimator="k1", threshold=0.5))
    got = mismatch_metrics(t, s, mask, apply_correction(t, s, mask, cfg), prefix="is/")
    # truncated: w = 2 > 1.5 (1 of 3); rejected: |k1| = ln2 > 0.5 for tokens 0 and 2 (2 of 3); no sequence lost
    assert got["is/truncated_fraction"] == pytest.approx(1 / 3)
    assert got["is/rejected_token_fraction"] == pytest.approx(2 / 3)
    assert got["is/masked_fraction"] == 0.0 and got["is/rejected_seq_fraction"] == 0.0


def _loop_metrics(t: torch.Tensor, s: torch.Tensor, rows: list[list[int]]) -> dict[str, float]:
    lr = [[float(t[i, j] - s[i, j]) for j in pos] for i, pos in enumerate(rows) if pos]
    flat = [x for r in lr for x in r]
    if not flat:
        return {"kl_k1": 0.0, "chi2_token": 0.0, "ess_token": 1.0, "ppl_ratio": 1.0, "ess_seq": 1.0}
    w = [math.exp(x) for x in flat]
    seq_w = [math.exp(sum(r)) for r in lr]
    diffs = [-sum(r) / len(r) for r in lr]
    return {
        "kl_k1": -sum(flat) / len(flat),
        "kl_k3": sum(math.exp(x) - 1 - x for x in flat) / len(flat),
        "log_ppl_diff_mean": sum(diffs) / len(diffs),
        "log_ppl_diff_abs_mean": sum(abs(d) for d in diffs) / len(diffs),
        "log_ppl_diff_max": max(diffs),
        "log_ppl_diff_min": min(diffs),
        "ppl_ratio": sum(math.exp(d) for d in diffs) / len(diffs),
        "chi2_token": sum(x * x for x in w) / len(w) - 1,
        "chi2_seq": sum(x * x for x in seq_w) / len(seq_w) - 1,
        "ess_token": sum(w) ** 2 / (len(w) * sum(x * x for x in w)),
        "ess_seq": sum(seq_w) ** 2 / (len(seq_w) * sum(x * x for x in seq_w)),
        "max_abs_logprob_diff": max(abs(x) for x in flat),
    }


@pytest.mark.parametrize("seed", range(40))
def test_mismatch_matches_loop(seed: int) -> None:
    b = make_batch(seed)
    got = mismatch_metrics(b.old_logp, b.sampler_logp, b.mask, prefix="")
    for k, v in _loop_metrics(b.old_logp, b.sampler_logp, b.rows()).items():
        assert math.isclose(got[k], v, rel_tol=1e-9, abs_tol=1e-12), k
    assert all(math.isfinite(v) for v in got.values())


@pytest.mark.parametrize("seed", range(40))
def test_shifting_sampler_logp_moves_metrics_exactly(seed: int) -> None:
    # sampler logp of one token - ln2: its weight w → 2w, so with N masked tokens and n in its row
    # k1 -= ln2/N; k3 += (w - ln2)/N; χ²_tok += 3w²/N; that row's log-ppl diff -= ln2/n; its sequence weight doubles
    b = batch_with_sampled_token(seed)
    rows = b.rows()
    i, j = pick_sampled_token(rows, seed)
    pos = rows[i]
    t, s = b.old_logp, b.sampler_logp
    s2 = s.clone()
    s2[i, j] -= LN2
    before = mismatch_metrics(t, s, b.mask, prefix="")
    after = mismatch_metrics(t, s2, b.mask, prefix="")
    n_tok, n_seq = sum(len(p) for p in rows), sum(1 for p in rows if p)
    w = math.exp(float(t[i, j] - s[i, j]))
    assert after["kl_k1"] - before["kl_k1"] == pytest.approx(-LN2 / n_tok, rel=1e-9)
    assert after["kl_k3"] - before["kl_k3"] == pytest.approx((w - LN2) / n_tok, rel=1e-9)
    assert after["chi2_token"] - before["chi2_token"] == pytest.approx(3 * w * w / n_tok, rel=1e-9)
    assert after["log_ppl_diff_mean"] - before["log_ppl_diff_mean"] == pytest.approx(-LN2 / len(pos) / n_seq, rel=1e-9)
    row_w = math.exp(sum(float(t[i, k] - s[i, k]) for k in pos))
    assert after["chi2_seq"] - before["chi2_seq"] == pytest.approx(3 * row_w * row_w / n_seq, rel=1e-9)
