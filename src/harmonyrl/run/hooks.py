"""Callbacks into a running ``train``: what a benchmark or a notebook watches without patching the loop.

``train(config, console, hooks=RunHooks(...))`` calls them at three points of the run:

* ``on_eval()`` wraps every held-out evaluation (before RL, every ``eval.every`` steps, after RL): a context
  manager entered around it; ``on_eval_done(metrics)`` is given its metrics afterwards — so a caller can time
  evaluations or change what they see (a benchmark switches its slow tool's delay off while evaluating, so
  evaluation time is not charged to the arm it measures).
* ``on_step(step, model)`` runs after each RL step is complete and checkpointed, with rank 0's plain policy.

They run on rank 0 in the run's own thread, and must not change the model: the run's results are the same with
and without hooks (the benchmarks that used to replace ``loop.held_out_eval`` and ``rl_phase.save_progress`` by
assignment now pass hooks instead).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch


def _no_eval() -> AbstractContextManager[None]:
    return nullcontext()


def _ignore(*args: object) -> None:
    return None


@dataclass(frozen=True)
class RunHooks:
    """The callbacks (see the module docstring); each defaults to doing nothing."""

    on_eval: Callable[[], AbstractContextManager[None]] = _no_eval
    """Entered around each held-out evaluation."""
    on_eval_done: Callable[[dict[str, float]], None] = _ignore
    """The evaluation's metrics (``eval/success``, …) once it finished."""
    on_step: Callable[[int, torch.nn.Module], None] = _ignore
    """RL step ``step`` is complete and saved; ``model`` is the plain policy after it."""


NO_HOOKS = RunHooks()


def hooked_eval(
    held_out: Callable[[], Awaitable[dict[str, float]]], hooks: RunHooks
) -> Callable[[], Awaitable[dict[str, float]]]:
    """``held_out`` with ``hooks.on_eval`` around each call and ``hooks.on_eval_done`` after it."""
    if hooks is NO_HOOKS:
        return held_out

    async def run() -> dict[str, float]:
        with hooks.on_eval():
            metrics = await held_out()
        hooks.on_eval_done(metrics)
        return metrics

    return run
