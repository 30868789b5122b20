"""Which process of a ``torchrun`` launch this is, and the few collectives the training loop needs.

``torchrun --nproc_per_node N`` sets ``WORLD_SIZE``, ``RANK`` and ``LOCAL_RANK`` (and the rendezvous address);
:func:`join` reads them and starts the process group: gloo on CPU; with CUDA a backend per device
(``cpu:gloo,cuda:nccl``), so a collective runs wherever its tensors are. With no such
variables, or ``WORLD_SIZE=1``, the run is the plain single process (:data:`SINGLE`) and nothing here touches
``torch.distributed``, so every collective below is a no-op there.

Rank 0 is the *main* process: it runs the engine and the rollouts, and alone writes to the run folder and the
console. The other ranks only train their shard of each batch (see :mod:`harmonyrl.distributed.fsdp`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


@dataclass(frozen=True)
class World:
    """This process's place in the launch: ``rank`` of ``size`` processes."""

    rank: int = 0
    size: int = 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that rolls out, evaluates and writes."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1


SINGLE = World()
"""The plain single-process run."""


class LaunchError(RuntimeError):
    """A launch environment that cannot start a process group (a user's set-up, reported in one line)."""


def launched_size(environ: Mapping[str, str] | None = None) -> int:
    """``WORLD_SIZE`` as torchrun sets it, 1 without it; a malformed value is a :class:`LaunchError`."""
    env = os.environ if environ is None else environ
    raw = env.get("WORLD_SIZE", "1")
    if not raw.isdigit() or int(raw) < 1:
        raise LaunchError(f"WORLD_SIZE={raw!r} is not a positive integer (launch with torchrun --nproc_per_node N)")
    return int(raw)


def join(environ: Mapping[str, str] | None = None) -> World:
    """Start the process group of a torchrun launch (see :func:`backend_for`); :data:`SINGLE` without one."""
    env = os.environ if environ is None else environ
    size = launched_size(env)
    if size == 1:
        return SINGLE
    missing = [k for k in ("RANK", "MASTER_ADDR", "MASTER_PORT") if k not in env]
    if missing:
        raise LaunchError(f"WORLD_SIZE={size} but {', '.join(missing)} unset: launch with torchrun --nproc_per_node N")
    if not dist.is_initialized():
        if torch.cuda.is_available():  # this rank's GPU first: NCCL binds the device current at its start
            torch.cuda.set_device(int(env.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend_for(torch.cuda.is_available()))
    return World(dist.get_rank(), dist.get_world_size())


def backend_for(cuda: bool) -> str:
    """The process group's backends, one per device: a collective on CPU tensors (the loop's figures, counts)
    goes over gloo, on CUDA tensors over NCCL, which refuses CPU tensors."""
    return "cpu:gloo,cuda:nccl" if cuda else "gloo"


def leave(world: World, *, clean: bool = True) -> None:
    """Tear the process group down (a no-op for the single process).

    After a clean finish every rank first waits for the others at a barrier: a rank that destroyed its gloo group
    while a peer was still busy (rank 0 saves, the others are done) aborted at exit now and then ("terminate
    called without an active exception": 2 launches in 14 on a 2-core machine, 0 in 20 with the barrier). A rank
    leaving on an error (``clean=False``) does not wait: its peers may be inside another collective, and torchrun
    stops them once this rank exits."""
    if world.distributed and dist.is_initialized():
        if clean:
            dist.barrier()
        dist.destroy_process_group()


def shard_rows(n: int, world: World) -> torch.Tensor:
    """This rank's rows of ``n`` (contiguous, the first ranks one longer when ``n`` does not divide):
    ``shard_rows(5, World(1, 2))`` is ``[3, 4]``. Every row belongs to exactly one rank; a rank may get none."""
    return torch.tensor_split(torch.arange(n), world.size)[world.rank]


def most_rows(n: int, world: World) -> int:
    """The largest shard of ``n`` rows: how many rows the busiest rank holds (``ceil(n / size)``)."""
    return -(-n // world.size)


def broadcast(value: T | None, world: World) -> T:
    """Rank 0's ``value`` on every rank (pickled); ``value`` is ignored on the other ranks."""
    if not world.distributed:
        assert value is not None
        return value
    box: list[Any] = [value if world.is_main else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]  # type: ignore[no-any-return]


def sum_all(values: torch.Tensor, world: World) -> torch.Tensor:
    """Element-wise sum of ``values`` over the ranks (in place; returned for chaining)."""
    if world.distributed:
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def max_all(values: torch.Tensor, world: World) -> torch.Tensor:
    """Element-wise max of ``values`` over the ranks (in place; returned for chaining)."""
    if world.distributed:
        dist.all_reduce(values, op=dist.ReduceOp.MAX)
    return values


def barrier(world: World) -> None:
    """Wait for every rank (a no-op for the single process)."""
    if world.distributed:
        dist.barrier()


def share_cores(world: World, threads: int, environ: Mapping[str, str] | None = None) -> None:
    """With ``threads=0`` (all cores) under torchrun, give each of the processes on this machine its share of the
    cores (``LOCAL_WORLD_SIZE``): N processes each using every core would oversubscribe the CPU."""
    if not world.distributed or threads > 0:
        return
    env = os.environ if environ is None else environ
    local = int(env.get("LOCAL_WORLD_SIZE", str(world.size)))
    torch.set_num_threads(max(1, torch.get_num_threads() // max(1, local)))
