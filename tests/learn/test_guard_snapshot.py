"""A guard's snapshot copies what an update can change (trainable parameters, optimizer state), never a frozen base."""

from __future__ import annotations

import torch

from harmonyrl.learn.guards import restore, take_snapshot


def test_snapshot_holds_only_trainable_parameters_and_restores_them_exactly() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    model[0].requires_grad_(False)  # the frozen base
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.1)
    snapshot = take_snapshot(model, None, optimizer)
    assert set(snapshot.states[0]) == {"1.weight", "1.bias"} and snapshot.states[1] == {}
    before = [p.detach().clone() for p in model.parameters()]
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    assert not torch.equal(before[2], model[1].weight)
    restore(snapshot, model, None, optimizer)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert optimizer.state_dict()["state"] == {}  # the moments the step took are gone too
