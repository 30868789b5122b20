"""The one optimizer step every learner uses: zero, backward, clip, guards, step — hand-checked on a linear model."""

from __future__ import annotations

import math

import pytest
import torch

from harmonyrl.algorithms.choices import Guards
from harmonyrl.learn.optimizer_step import NO_GUARDS, GuardFigures, optimizer_step, warmup_scale


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


def test_the_warmup_scale_is_linear_then_one() -> None:
    assert [warmup_scale(n, 4) for n in (1, 2, 3, 4, 5, 9)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert warmup_scale(1, 0) == 1.0


def _constant_gradient_steps(
    optimizer: torch.optim.Optimizer, w: torch.nn.Parameter, n: int, warmup: int
) -> list[float]:
    """How far each of ``n`` steps moves ``w`` under a constant gradient of 1: with Adam (bias-corrected,
    ``m̂ / √v̂ = 1`` for a constant gradient) each step moves by exactly its learning rate."""
    moved = []
    for _ in range(n):
        before = float(w.detach())

        def backward() -> GuardFigures:
            w.grad = torch.ones_like(w)
            return GuardFigures(loss=0.0)

        optimizer_step(optimizer, [w], backward, max_grad_norm=10.0, warmup=warmup)
        moved.append(before - float(w.detach()))
    return moved


def test_a_warmup_ramps_each_steps_learning_rate_and_resumes_where_it_stopped() -> None:
    w = torch.nn.Parameter(torch.zeros(()))
    optimizer = torch.optim.AdamW([w], lr=0.1, weight_decay=0.0, eps=1e-12)
    moved = _constant_gradient_steps(optimizer, w, 2, warmup=4)
    assert optimizer.param_groups[0]["lr"] == 0.1  # the configured rate is kept (the checkpoint saves it)
    resumed = torch.optim.AdamW([w], lr=0.1, weight_decay=0.0, eps=1e-12)
    resumed.load_state_dict(optimizer.state_dict())  # a resume: the step count comes with the state
    moved += _constant_gradient_steps(resumed, w, 3, warmup=4)
    assert moved == pytest.approx([0.025, 0.05, 0.075, 0.1, 0.1], rel=1e-5)


def test_no_warmup_steps_at_the_full_rate_and_a_warmup_needs_adam() -> None:
    w = torch.nn.Parameter(torch.zeros(()))
    assert _constant_gradient_steps(torch.optim.AdamW([w], lr=0.1, eps=1e-12, weight_decay=0.0), w, 2, 0) == \
        pytest.approx([0.1, 0.1], rel=1e-5)  # fmt: skip
    with pytest.raises(TypeError, match="warm-up counts Adam's steps"):
        _constant_gradient_steps(torch.optim.SGD([w], lr=0.1), w, 1, warmup=2)
