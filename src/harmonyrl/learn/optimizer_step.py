"""One optimizer step, written once for every learner: RL, soft-Q, SFT and reward-model training.

    zero the gradients → ``backward()`` (the caller's loss closure: forward, loss, backward over its micro-batches,
    returning the figures the guards read) → clip with the FSDP-aware norm → the stability guards → step, or no
    step when a guard trips.

Each learner had its own copy of these five lines and they had drifted: SFT clipped at a hard-coded 1.0 and
stepped on a non-finite loss (poisoning the weights it then checkpointed); soft-Q clipped with torch's own
function, which under FSDP would have computed each rank's local norm instead of the global one. Rolling back
*earlier* steps of a multi-step update when a later one trips stays with the caller
(:func:`~harmonyrl.learn.guards.take_snapshot` / :func:`~harmonyrl.learn.guards.restore`), because only the
caller knows which modules the update changes (the soft-Q target head, a value head).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from harmonyrl.algorithms.choices import Guards
from harmonyrl.distributed.fsdp import clip_grad_norm
from harmonyrl.learn.guards import trip_reason

NO_GUARDS = Guards(max_grad_norm=None, max_kl=None, min_entropy=None, max_entropy=None)
"""Only the guards that always hold: a non-finite loss or gradient is never stepped on."""


@dataclass(frozen=True)
class GuardFigures:
    """What the guards read from one step's backward pass (summed over the ranks by the closure)."""

    loss: float
    kl: float | None = None
    entropy: float | None = None


@dataclass(frozen=True)
class StepOutcome:
    """``grad_norm``: the norm before clipping; ``tripped``: the guard that stopped the step, or None (applied)."""

    grad_norm: float
    tripped: str | None

    @property
    def applied(self) -> bool:
        return self.tripped is None


def optimizer_step(
    optimizer: torch.optim.Optimizer,
    params: Sequence[torch.Tensor],
    backward: Callable[[], GuardFigures],
    max_grad_norm: float,
    guards: Guards = NO_GUARDS,
    warmup: int = 0,
) -> StepOutcome:
    """Zero, ``backward()``, clip ``params`` to ``max_grad_norm`` (the global norm when sharded), check
    ``guards``, and step ``optimizer`` unless one trips, at :func:`warmup_scale` of its learning rate. ``params``
    are the ones the optimizer trains, in the caller's order (the norm is a sum over them)."""
    optimizer.zero_grad(set_to_none=True)
    figures = backward()
    grad_norm = clip_grad_norm(params, max_grad_norm)
    tripped = trip_reason(guards, loss=figures.loss, grad_norm=grad_norm, kl=figures.kl, entropy=figures.entropy)
    if warmup > 0 and not isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW):
        raise TypeError(f"a learning-rate warm-up counts Adam's steps; {type(optimizer).__name__} keeps no count")
    if tripped is None:
        with scaled_lr(optimizer, warmup_scale(steps_taken(optimizer) + 1, warmup)):
            optimizer.step()
    return StepOutcome(grad_norm, tripped)


def warmup_scale(n: int, warmup: int) -> float:
    """The learning-rate factor of the ``n``-th optimizer step (1-based) under a linear warm-up of ``warmup``
    steps: ``n / warmup`` until it reaches 1; always 1 with ``warmup == 0``."""
    return 1.0 if warmup <= 0 else min(1.0, n / warmup)


def steps_taken(optimizer: torch.optim.Optimizer) -> int:
    """How many steps ``optimizer`` has applied, from its own state (Adam's per-parameter ``step``, saved in a
    checkpoint with it); 0 before the first."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            step = optimizer.state.get(p, {}).get("step")
            if step is not None:
                return int(step)
    return 0


@contextmanager
def scaled_lr(optimizer: torch.optim.Optimizer, scale: float) -> Iterator[None]:
    """Every parameter group's learning rate times ``scale`` inside the block, restored after it (the
    checkpoint keeps the configured rate). ``scale == 1.0`` touches nothing."""
    if scale == 1.0:
        yield
        return
    saved = [group["lr"] for group in optimizer.param_groups]
    for group, lr in zip(optimizer.param_groups, saved, strict=True):
        group["lr"] = lr * scale
    try:
        yield
    finally:
        for group, lr in zip(optimizer.param_groups, saved, strict=True):
            group["lr"] = lr
