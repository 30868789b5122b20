"""The one optimizer step every learner uses: zero, backward, clip, guards, step — hand-checked on a linear model."""

from __future__ import annotations

import math

import pytest
import torch

from harmonyrl.algorithms.choices import Guards
from harmonyrl.learn.optimizer_step import NO_GUARDS, GuardFigures, optimizer_step


def _setup() -> tuple[torch.nn.Parameter, torch.optim.Optimizer]:
    weight = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    return weight, torch.optim.SGD([weight], lr=1.0)


def test_the_step_clips_to_the_norm_and_reports_it_before_clipping() -> None:
    weight, optimizer = _setup()
    weight.grad = torch.tensor([100.0, 100.0])  # stale: zeroed before the closure runs

    def backward() -> GuardFigures:
        loss = (torch.tensor([3.0, 4.0]) * weight).sum()  # gradient [3, 4], norm 5
        loss.backward()
        return GuardFigures(float(loss.detach()))

    outcome = optimizer_step(optimizer, [weight], backward, max_grad_norm=1.0)
    assert outcome.applied and math.isclose(outcome.grad_norm, 5.0, rel_tol=1e-6)
    # clipped to norm 1: [0.6, 0.8], one SGD step of lr 1
    assert torch.allclose(weight.detach(), torch.tensor([0.4, 1.2]))


@pytest.mark.parametrize(
    ("figures", "guards", "reason"),
    [
        (GuardFigures(float("nan")), NO_GUARDS, "nonfinite_loss"),
        (GuardFigures(1.0, kl=0.5), Guards(max_kl=0.1), "kl"),
        (GuardFigures(1.0, entropy=0.01), Guards(min_entropy=0.1), "entropy_low"),
    ],
)
def test_a_tripped_guard_leaves_the_weights_and_optimizer_alone(
    figures: GuardFigures, guards: Guards, reason: str
) -> None:
    weight, optimizer = _setup()

    def backward() -> GuardFigures:
        (weight * 2.0).sum().backward()
        return figures

    outcome = optimizer_step(optimizer, [weight], backward, max_grad_norm=10.0, guards=guards)
    assert outcome.tripped == reason and not outcome.applied
    assert torch.equal(weight.detach(), torch.tensor([1.0, 2.0]))


def test_a_gradient_norm_guard_reads_the_norm_before_clipping() -> None:
    weight, optimizer = _setup()

    def backward() -> GuardFigures:
        (weight * 30.0).sum().backward()  # norm 30·√2 ≈ 42.4
        return GuardFigures(0.0)

    outcome = optimizer_step(optimizer, [weight], backward, max_grad_norm=1.0, guards=Guards(max_grad_norm=40.0))
    assert outcome.tripped == "grad_norm"
