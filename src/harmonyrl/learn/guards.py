"""Stability guards: detect an exploding or broken update and roll the whole RL step back.

An RL step may take several optimizer steps (epochs × minibatches). Each is checked *before* it is applied —
a non-finite loss or gradient, a gradient norm, KL to the reference or an entropy out of bounds — so a trip
on the first (or only) one needs no undo. When a later one trips, the model, critic and optimizer are
restored to their state before the RL step, so a bad update is never applied, never checkpointed and never
sent to the engine. That snapshot (one copy of weights and optimizer state) is only taken when the step
plans more than one optimizer step.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import torch

from harmonyrl.algorithms.choices import Guards


@dataclass(frozen=True)
class Snapshot:
    states: tuple[dict[str, Any], ...]


def take_snapshot(*modules: torch.nn.Module | torch.optim.Optimizer | None) -> Snapshot:
    """Copies of what an update can change in ``modules``: a module's trainable parameters (a frozen base is never
    copied: with LoRA that would be the whole model again, 42 GB for gpt-oss-20b in bf16), an optimizer's whole
    state. ``None`` entries are kept as empty placeholders."""
    return Snapshot(tuple(_changeable(m) for m in modules))


def _changeable(m: torch.nn.Module | torch.optim.Optimizer | None) -> dict[str, Any]:
    if m is None:
        return {}
    if isinstance(m, torch.nn.Module):
        return {name: p.detach().clone() for name, p in m.named_parameters() if p.requires_grad}
    return copy.deepcopy(m.state_dict())


def restore(snapshot: Snapshot, *modules: torch.nn.Module | torch.optim.Optimizer | None) -> None:
    """Put ``snapshot`` back into the same ``modules``, in the same order as :func:`take_snapshot`."""
    for state, module in zip(snapshot.states, modules, strict=True):
        if isinstance(module, torch.nn.Module):
            params = dict(module.named_parameters())
            with torch.no_grad():
                for name, saved in state.items():
                    params[name].copy_(saved)
        elif module is not None:
            module.load_state_dict(state)


def trip_reason(
    guards: Guards, *, loss: float, grad_norm: float, kl: float | None = None, entropy: float | None = None
) -> str | None:
    """The first guard that trips on these measurements, as a short metric-safe name, or None."""
    if not math.isfinite(loss):
        return "nonfinite_loss"
    if not math.isfinite(grad_norm):
        return "nonfinite_grad"
    if guards.max_grad_norm is not None and grad_norm > guards.max_grad_norm:
        return "grad_norm"
    if kl is not None and guards.max_kl is not None and not kl <= guards.max_kl:
        return "kl"
    if entropy is not None and guards.min_entropy is not None and entropy < guards.min_entropy:
        return "entropy_low"
    if entropy is not None and guards.max_entropy is not None and entropy > guards.max_entropy:
        return "entropy_high"
    return None
