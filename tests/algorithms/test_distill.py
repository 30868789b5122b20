"""The on-policy distillation term against hand-derived values."""

from __future__ import annotations

import math

import pytest
import torch

from harmonyrl.algorithms.distill import distill_metrics, full_reverse_kl, reverse_kl_advantage


def test_the_advantage_is_minus_weight_times_the_per_token_reverse_kl() -> None:
    # row 0: student log π = [ln .5, ln .25, ln .8], teacher [ln .25, ln .5, ln .8], mask [1, 1, 0]
    #   k = [ln 2, -ln 2, (masked) 0]; weight 2 → advantage [-2 ln 2, 2 ln 2, 0]
    # row 1: student [ln .1, 0, 0], teacher [ln .1, 0, 0], mask [1, 0, 0] → k = [0, 0, 0]
    s = torch.log(torch.tensor([[0.5, 0.25, 0.8], [0.1, 1.0, 1.0]]))
    t = torch.log(torch.tensor([[0.25, 0.5, 0.8], [0.1, 1.0, 1.0]]))
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    term = reverse_kl_advantage(s, t, mask, weight=2.0)
    ln2 = math.log(2)
    assert torch.allclose(term.reverse_kl, torch.tensor([[ln2, -ln2, 0.0], [0.0, 0.0, 0.0]]))
    assert torch.allclose(term.advantage, torch.tensor([[-2 * ln2, 2 * ln2, 0.0], [0.0, 0.0, 0.0]]))
    metrics = distill_metrics(term, s, t, mask)
    # 3 masked tokens: k = ln2, -ln2, 0 → mean 0; per sequence: row 0 (ln2 - ln2)/2 = 0, row 1 0 → 0
    assert metrics["distill/reverse_kl"] == pytest.approx(0.0, abs=1e-12)
    assert metrics["distill/reverse_kl_seq"] == pytest.approx(0.0, abs=1e-12)
    # student: (ln .5 + ln .25 + ln .1) / 3; teacher: (ln .25 + ln .5 + ln .1) / 3 (the same sum)
    assert metrics["distill/student_logp"] == pytest.approx(math.log(0.5 * 0.25 * 0.1) / 3, rel=1e-6)
    assert metrics["distill/teacher_logp"] == pytest.approx(math.log(0.5 * 0.25 * 0.1) / 3, rel=1e-6)
    # the teacher is likelier on 1 of the 3 (token 2 of row 0: .5 > .25)
    assert metrics["distill/teacher_prefers"] == pytest.approx(1 / 3)


def test_a_student_that_matches_the_teacher_gets_nothing() -> None:
    s = torch.log(torch.tensor([[0.3, 0.6]]))
    term = reverse_kl_advantage(s, s.clone(), torch.ones(1, 2), weight=5.0)
    assert torch.equal(term.advantage, torch.zeros(1, 2))


def test_the_sequence_mean_weights_each_sequence_once() -> None:
    # row 0: one token, k = 1; row 1: three tokens, k = 0 each → token mean 1/4, sequence mean (1 + 0)/2
    s = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    t = torch.zeros(2, 3)
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    metrics = distill_metrics(reverse_kl_advantage(s, t, mask, 1.0), s, t, mask)
    assert metrics["distill/reverse_kl"] == pytest.approx(0.25) and metrics["distill/reverse_kl_seq"] == 0.5


def test_nothing_masked_gives_zeros_and_no_gradient_flows() -> None:
    s = torch.zeros(1, 2, requires_grad=True)
    term = reverse_kl_advantage(s, torch.zeros(1, 2), torch.zeros(1, 2), 1.0)
    assert not term.advantage.requires_grad
    assert all(v == 0.0 for v in distill_metrics(term, s.detach(), torch.zeros(1, 2), torch.zeros(1, 2)).values())


def test_shapes_must_agree() -> None:
    with pytest.raises(ValueError, match="one shape"):
        reverse_kl_advantage(torch.zeros(1, 2), torch.zeros(1, 3), torch.ones(1, 2), 1.0)


def test_centring_subtracts_the_batch_mean_over_the_masked_tokens() -> None:
    # k on the mask = [3, 1, 2] (one masked-out position holds 100): mean 2 → advantage -(k - 2) = [-1, 1, 0]
    s = torch.tensor([[3.0, 1.0, 100.0], [2.0, 0.0, 0.0]])
    t = torch.zeros(2, 3)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    term = reverse_kl_advantage(s, t, mask, weight=1.0, center=True)
    assert torch.equal(term.advantage, torch.tensor([[-1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]))
    assert torch.equal(term.reverse_kl, torch.tensor([[3.0, 1.0, 0.0], [2.0, 0.0, 0.0]]))  # the metric is uncentred
    assert float(term.advantage.sum()) == 0.0  # a baseline: the term sums to 0 over the batch


def test_the_full_reverse_kl_sums_over_the_vocabulary() -> None:
    # student π = (.5, .5), teacher π_T = (.25, .75): .5 ln(.5/.25) + .5 ln(.5/.75) = .5 ln(4/3)
    # second position: student (.2, .8), teacher the same distribution from shifted logits → 0
    s = torch.log(torch.tensor([[[0.5, 0.5], [0.2, 0.8]]]))
    t = torch.log(torch.tensor([[[0.25, 0.75], [0.2, 0.8]]])) + torch.tensor([[[0.0, 0.0], [3.0, 3.0]]])
    kl = full_reverse_kl(s, t)
    assert kl.shape == (1, 2)
    assert kl[0, 0].item() == pytest.approx(0.5 * math.log(4 / 3), rel=1e-6)
    assert kl[0, 1].item() == pytest.approx(0.0, abs=1e-6)


def test_the_full_reverse_kl_gradient_is_hand_derived_and_reaches_the_student_only() -> None:
    # d/dz_v Σ_u π_u (log π_u - log q_u) = π_v (log π_v - log q_v - KL) for softmax logits z
    z = torch.tensor([[0.3, -1.0, 2.0]], requires_grad=True)
    q_logits = torch.tensor([[1.0, 0.5, -0.5]], requires_grad=True)
    kl = full_reverse_kl(z, q_logits)
    kl.sum().backward()
    p, log_q = torch.softmax(z.detach(), -1), torch.log_softmax(q_logits.detach(), -1)
    expected = p * (p.log() - log_q - kl.detach()[:, None])
    assert z.grad is not None and torch.allclose(z.grad, expected, atol=1e-6)
    assert q_logits.grad is None  # the teacher is a constant
    assert kl.item() > 0


def test_the_full_reverse_kl_needs_one_shape() -> None:
    with pytest.raises(ValueError, match="must have one shape"):
        full_reverse_kl(torch.zeros(2, 3, 4), torch.zeros(2, 3, 5))
