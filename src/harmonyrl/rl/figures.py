"""The figures one RL update produces, as values: each micro-batch's share-weighted contributions, each optimizer
step's (summed over the ranks, with its gradient norm and the guard that stopped it), and the update's.

:func:`~harmonyrl.rl.update.rl_update` builds them bottom-up — a micro-batch returns a :class:`Micro`, an optimizer
step a :class:`StepFigures`, the update an :class:`UpdateFigures` — instead of adding into running tallies passed
down the calls. Every sum runs in the order the passes ran (micro-batch by micro-batch, step by step), so the
metrics are bit-exact run to run and equal to the tallies they replace.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harmonyrl.distributed.world import World, max_all, sum_all
from harmonyrl.models.moe_routing import MoeRouting


@dataclass(frozen=True)
class Micro:
    """One micro-batch's contributions, weighted by its share of the minibatch (``dev`` is a max, not a share)."""

    loss: float
    kl_live: float
    entropy: float
    clip: float
    value_loss: float
    dev: float
    routing: MoeRouting | None
    """The single pass's record of this micro-batch's routing (None when another pass records it)."""
    distill_kl: float = 0.0
    """``rl.distill.kind=full``: the exact per-token reverse KL to the teacher, weighted by the token share."""


@dataclass(frozen=True)
class StepFigures:
    """One optimizer step: its micro-batches in order, its figures summed (and maxed) over the ranks, its gradient
    norm and the guard that stopped it, if one did."""

    micro: tuple[Micro, ...]
    loss: float
    kl_live: float
    entropy: float
    dev: float
    grad_norm: float
    tripped: str | None


@dataclass(frozen=True)
class UpdateFigures:
    """The update's figures over its optimizer steps, summed in a fixed order (so metrics are bit-exact)."""

    steps: tuple[StepFigures, ...]
    clip: float
    value_loss: float

    @staticmethod
    def of(steps: list[StepFigures], world: World) -> UpdateFigures:
        micro = [m for step in steps for m in step.micro]
        clip = value_loss = 0.0
        for m in micro:
            clip += m.clip
            value_loss += m.value_loss
        clip, value_loss = (float(x) for x in sum_all(torch.tensor([clip, value_loss]), world))
        return UpdateFigures(tuple(steps), clip, value_loss)

    @property
    def tripped(self) -> str | None:
        return self.steps[-1].tripped if self.steps else None

    @property
    def recorded(self) -> list[MoeRouting]:
        return [m.routing for step in self.steps for m in step.micro if m.routing is not None]


def over_ranks(micro: list[Micro], world: World) -> tuple[float, float, float, float]:
    """The step's ``(loss, kl_live, entropy, dev)`` over the whole minibatch: this rank's micro-batches summed in
    order, then the ranks' sums added (the deviation maxed)."""
    loss = kl_live = entropy = dev = 0.0
    for m in micro:
        loss += m.loss
        kl_live += m.kl_live
        entropy += m.entropy
        dev = max(dev, m.dev)
    if not world.distributed:
        return loss, kl_live, entropy, dev
    summed = sum_all(torch.tensor([loss, kl_live, entropy], dtype=torch.float64), world)
    loss, kl_live, entropy = (float(x) for x in summed)
    return loss, kl_live, entropy, float(max_all(torch.tensor([dev], dtype=torch.float64), world))
