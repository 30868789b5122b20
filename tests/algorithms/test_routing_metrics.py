"""Routing diagnostics against values derived by hand (comments) and transformers' aux loss."""

from __future__ import annotations

import math

import torch
from transformers.models.gpt_oss.modeling_gpt_oss import load_balancing_loss_func

from harmonyrl.algorithms.routing_metrics import expert_load, load_imbalance, router_aux_loss, routing_agreement


def test_agreement_compares_sets_and_skips_unrecorded_and_invalid() -> None:
    # 3 tokens x 2 layers x k=2
    a = torch.tensor([[[0, 1], [2, 3]], [[1, 0], [0, 2]], [[3, 2], [-1, 1]]])
    b = torch.tensor([[[1, 0], [2, 3]], [[1, 0], [0, 3]], [[0, 2], [1, 2]]])
    valid = torch.tensor([True, True, True])
    # pairs: (t0,l0) {0,1}={0,1} yes; (t0,l1) yes; (t1,l0) yes; (t1,l1) {0,2}≠{0,3} no;
    # (t2,l0) {2,3}≠{0,2} no; (t2,l1) a has -1 → skipped. 3 agree of 5 counted.
    assert routing_agreement(a, b, valid) == 3 / 5
    # token 2 invalid: 3 of 4
    assert routing_agreement(a, b, torch.tensor([True, True, False])) == 3 / 4
    assert routing_agreement(a, a, valid) == 1.0
    assert routing_agreement(a, b, torch.zeros(3, dtype=torch.bool)) == 1.0  # nothing counted


def test_expert_load_and_imbalance() -> None:
    # 1 layer, k=1, E=4; tokens go to experts 0, 0, 1, 3 and a padded token to 2 (not counted)
    ids = torch.tensor([[[0]], [[0]], [[1]], [[3]], [[2]]])
    valid = torch.tensor([True, True, True, True, False])
    load = expert_load(ids, valid, 4)
    assert torch.equal(load, torch.tensor([[0.5, 0.25, 0.0, 0.25]], dtype=torch.float64))
    max_over_mean, cv = load_imbalance(load)
    # mean 0.25: max/mean = 2; deviations .25, 0, -.25, 0 → std = sqrt(.125/4) = .1768 → cv = .7071
    assert math.isclose(float(max_over_mean[0]), 2.0)
    assert math.isclose(float(cv[0]), math.sqrt(0.5), rel_tol=1e-12)
    # extremes: balanced (1, 0); all on one of E=4 → (4, sqrt(3))
    m, c = load_imbalance(torch.tensor([[0.25] * 4, [1.0, 0, 0, 0]], dtype=torch.float64))
    assert torch.allclose(m, torch.tensor([1.0, 4.0], dtype=torch.float64))
    assert torch.allclose(c, torch.tensor([0.0, math.sqrt(3)], dtype=torch.float64))


def test_router_aux_loss_by_hand_and_vs_transformers() -> None:
    ln3 = math.log(3.0)
    # E=2, k=1, one layer. Token logits [ln3, 0] → p = [.75, .25], top-1 expert 0; [0, ln3] → p = [.25, .75],
    # expert 1. f = [.5, .5], P = [.5, .5] → loss = 2·(.25 + .25) = 1.0 (balanced).
    balanced = torch.tensor([[[ln3, 0.0]], [[0.0, ln3]]], dtype=torch.float64)
    assert math.isclose(router_aux_loss(balanced, torch.tensor([True, True]), 1), 1.0, rel_tol=1e-12)
    # both tokens [ln3, 0]: f = [1, 0], P = [.75, .25] → 2·.75 = 1.5
    skewed = torch.tensor([[[ln3, 0.0]], [[ln3, 0.0]]], dtype=torch.float64)
    assert math.isclose(router_aux_loss(skewed, torch.tensor([True, True]), 1), 1.5, rel_tol=1e-12)
    # the invalid token is ignored: balanced logits + a masked skewed token still give 1.0
    mixed = torch.cat([balanced, skewed[:1]])
    assert math.isclose(router_aux_loss(mixed, torch.tensor([True, True, False]), 1), 1.0, rel_tol=1e-12)
    # equals transformers' load_balancing_loss_func (layers given as a tuple of [N, E])
    logits = torch.randn(10, 3, 8, generator=torch.Generator().manual_seed(0))
    hf = load_balancing_loss_func(tuple(logits[:, i] for i in range(3)), num_experts=8, top_k=2)
    assert math.isclose(router_aux_loss(logits, torch.ones(10, dtype=torch.bool), 2), float(hf), rel_tol=1e-6)
