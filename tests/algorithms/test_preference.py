"""Bradley–Terry loss, pairwise accuracy, calibration and proxy/true agreement against values derived by hand."""

from __future__ import annotations

import math

import pytest
import torch

from harmonyrl.algorithms.preference import (
    bradley_terry_loss,
    expected_calibration_error,
    pairwise_accuracy,
    ranking_agreement,
)


def test_bt_loss_hand_values() -> None:
    # pair 1: gap 0 → −log σ(0) = log 2 = 0.693147; pair 2: gap 2 → −log σ(2) = log(1 + e^-2) = 0.126928
    chosen, rejected = torch.tensor([1.0, 3.0]), torch.tensor([1.0, 1.0])
    loss = bradley_terry_loss(chosen, rejected)
    assert float(loss) == pytest.approx((math.log(2) + math.log(1 + math.exp(-2))) / 2, abs=1e-6)


def test_bt_loss_margin_and_centring() -> None:
    # gap 2, margin 2 → −log σ(0) = log 2; centring 0.1 · (3 + 1)^2 = 1.6; total 2.293147
    loss = bradley_terry_loss(torch.tensor([3.0]), torch.tensor([1.0]), torch.tensor([2.0]), centring=0.1)
    assert float(loss) == pytest.approx(math.log(2) + 1.6, abs=1e-6)


def test_bt_loss_large_gap_is_finite() -> None:
    # gap −200: −log σ(−200) = 200 + log(1 + e^-200) ≈ 200 (log(sigmoid) would give inf)
    assert float(bradley_terry_loss(torch.tensor([-100.0]), torch.tensor([100.0]))) == pytest.approx(200.0)


def test_bt_loss_gradient_pushes_chosen_up() -> None:
    chosen = torch.tensor([0.0], requires_grad=True)
    bradley_terry_loss(chosen, torch.tensor([0.0])).backward()
    assert chosen.grad is not None and float(chosen.grad[0]) == pytest.approx(-0.5)  # −(1 − σ(0))


def test_pairwise_accuracy_counts_ties_wrong() -> None:
    assert pairwise_accuracy(torch.tensor([2.0, 1.0, 0.0, 5.0]), torch.tensor([1.0, 1.0, 1.0, 4.0])) == 0.5


def test_ece_hand_values() -> None:
    # p = 0.5 everywhere: both sides in bin 5, confidence 0.5, accuracy 0.5 → 0
    assert expected_calibration_error(torch.tensor([0.5, 0.5])) == pytest.approx(0.0)
    # p = 0.9 (one pair): bin 9 holds 0.9 with label 1 → |0.9 − 1| = 0.1, bin 0 holds 0.1 with label 0 → 0.1;
    # weights 1/2 each → 0.1
    assert expected_calibration_error(torch.tensor([0.9])) == pytest.approx(0.1)
    # p = 1.0: confident and right → 0
    assert expected_calibration_error(torch.tensor([1.0])) == pytest.approx(0.0)


def test_ranking_agreement_hand_values() -> None:
    # group 0: truths 1, 0, 0 → pairs (0,1), (0,2) count; proxy 0.9 > 0.1 agrees, 0.9 vs 0.9 ties (½) → 1.5 / 2
    # group 1: truths equal → no pair. Across groups never compared.
    proxy, truth, groups = [0.9, 0.1, 0.9, 5.0, -5.0], [1.0, 0.0, 0.0, 1.0, 1.0], [0, 0, 0, 1, 1]
    assert ranking_agreement(proxy, truth, groups) == pytest.approx(0.75)
    assert math.isnan(ranking_agreement([1.0], [1.0], [0]))
