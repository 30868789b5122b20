"""The trainer's model under FSDP2 (``torch.distributed.fsdp.fully_shard``), and its state in and out.

**What is sharded.** Every decoder layer is its own FSDP unit and the root (embeddings, final norm, LM head)
another, so a forward all-gathers one layer's weights at a time. Parameters, gradients and the AdamW state
live as ``DTensor`` shards, one per rank. The trained module is a deep copy of the run's plain model
(:func:`sharded_copy`); the plain model stays the thing the engine, the HF checkpoint and evaluation read, and
:func:`copy_into` refreshes it on rank 0 from the gathered full state dict after each update.

**Gradients are summed, not averaged.** Each rank's loss is already divided by the *global* normaliser (the
whole minibatch's token or sequence count, see :func:`harmonyrl.algorithms.losses.aggregation_units`), so the
global gradient is the plain sum of the ranks' gradients: the divide factor is 1 and the reduction forced to
``SUM`` (gloo has no pre-multiplied sum). Gradient clipping uses the global norm: the per-shard norms are
``DTensor``\\ s whose ``full_tensor()`` is the norm over every shard (:func:`clip_grad_norm`).

**Checkpoints.** Model and optimizer are written with ``torch.distributed.checkpoint`` (DCP), one file per
rank plus metadata; DCP reshards on load, so a run saved by N processes resumes on M (including one).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar, cast

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
    set_state_dict,
)
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor

from harmonyrl.distributed.world import World

M = TypeVar("M", bound=torch.nn.Module)

SHARDED_DIR = "sharded"
"""The DCP folder inside a checkpoint written by a distributed run (model + optimizer shards)."""


def _units(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The FSDP units of a transformers decoder model: each decoder layer (``model.model.layers``), if any."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    return list(layers) if isinstance(layers, torch.nn.ModuleList) else []


def shard(model: M, world: World) -> M:
    """``model`` wrapped in place: each decoder layer then the root; gradients summed over the ranks."""
    units: list[torch.nn.Module] = [*_units(model), model]
    for unit in units:
        fully_shard(unit)
    for unit in units:
        fsdp = cast(FSDPModule, unit)
        fsdp.set_gradient_divide_factor(1.0)
        fsdp.set_force_sum_reduction_for_comms(True)
    return model


def full_state_dict(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The full (unsharded) state dict, gathered onto rank 0's CPU; empty on the other ranks. A collective:
    every rank must call it."""
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return cast(dict[str, torch.Tensor], get_model_state_dict(module, options=opts))


def sharded_copy(model: M, world: World) -> M:
    """A sharded deep copy of ``model`` holding rank 0's weights on every rank (broadcast), so ranks that built
    their plain model differently (a resume reads the checkpoint on rank 0 only) start identical."""
    module = shard(copy.deepcopy(model), world)
    full = model.state_dict() if world.is_main else {}
    opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(module, full, options=opts)
    return module


def copy_into(plain: torch.nn.Module, module: torch.nn.Module, world: World) -> None:
    """Gather ``module``'s full weights into rank 0's ``plain`` model (a collective; other ranks' ``plain`` is
    left as is: nothing reads it)."""
    full = full_state_dict(module)
    if world.is_main:
        plain.load_state_dict(full)


def clip_grad_norm(params: Iterable[torch.Tensor], max_norm: float) -> float:
    """Clip the gradients of ``params`` to a total 2-norm of ``max_norm``; returns the norm before clipping.

    For sharded (``DTensor``) gradients the norm is the global one over every rank's shards; for plain tensors
    this is exactly ``torch.nn.utils.clip_grad_norm_``."""
    params = list(params)
    grads = [p.grad for p in params if p.grad is not None]
    total = torch.nn.utils.get_total_norm(grads, 2.0)
    if isinstance(total, DTensor):
        total = total.full_tensor()
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return float(total)


def save_sharded(folder: Path, module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Write ``module`` and ``optimizer`` with DCP into ``folder`` (every rank its shard; a collective)."""
    model_sd, optim_sd = get_state_dict(module, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=folder)


def load_sharded(folder: Path, module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Read a DCP checkpoint of :func:`save_sharded` into ``module`` and ``optimizer``, resharded to this run's
    world size (a collective; also works in a single process on plain modules)."""
    model_sd, optim_sd = get_state_dict(module, optimizer)
    state: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=folder)
    set_state_dict(module, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def load_full_optimizer(
    plain: torch.nn.Module, plain_state: dict[str, Any], module: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> None:
    """Load a single-process optimizer state (``torch.optim`` ``state_dict()`` of an AdamW over ``plain``'s
    parameters) into the sharded ``optimizer`` of ``module``: each rank keeps its shard of it."""
    scratch = torch.optim.AdamW(plain.parameters())
    scratch.load_state_dict(plain_state)
    full = get_optimizer_state_dict(plain, scratch, options=StateDictOptions(full_state_dict=True))
    set_optimizer_state_dict(module, optimizer, full, options=StateDictOptions(full_state_dict=True))
