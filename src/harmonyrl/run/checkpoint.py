"""Atomic, durable checkpoints that are data, not code.

**Atomic.** Everything is written to ``NAME.tmp``, then switched in with two renames: ``NAME`` → ``NAME.old``,
``NAME.tmp`` → ``NAME``; ``NAME.old`` is removed last. A directory cannot be replaced by a rename while it holds
files, so the switch has a window in which ``NAME`` does not exist; a reader must then take ``NAME.old``, the
previous complete checkpoint (:func:`committed`), never conclude that there is none (invariant 7). A crash
while writing leaves at most a stray ``NAME.tmp``; the last good checkpoint is never touched until the new one
is complete.

**Durable.** Every file of the new folder and the folder itself are fsynced before the switch, and the parent
folder after each rename, so after a power cut the directory entries point at complete files.

**Data, not code.** ``trainer_state.pt`` holds only tensors and plain containers (dicts, lists, tuples,
numbers, strings, bytes) and is read with ``torch.load(weights_only=True)`` (:func:`load_state`): a crafted
file cannot execute anything, it is refused with a one-line :class:`~harmonyrl.errors.CheckpointError`.

**Distributed.** Under torchrun (``world``) the model and optimizer shards go to ``NAME.tmp/sharded/`` with
``torch.distributed.checkpoint`` (every rank writes its own files; a shared folder is assumed), and rank 0
writes the rest as above: the HF-loadable ``model.safetensors`` + config (its plain model, which the caller has
brought up to date), the trainer state (``optimizer`` None: it is in ``sharded/``) and the switch. Barriers
keep the ranks in step: nobody writes before the folder is fresh, and nobody goes on before the switch.
"""

from __future__ import annotations

import os
import pickle
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from harmonyrl.distributed.fsdp import SHARDED_DIR, save_sharded
from harmonyrl.distributed.world import SINGLE, World, barrier
from harmonyrl.errors import CheckpointError
from harmonyrl.models.tiny_gpt_oss import save_model
from harmonyrl.run.checkpoint_files import CheckpointFiles
from harmonyrl.run.state import Rngs

STATE_FILE = "trainer_state.pt"


def _fsync_path(path: Path) -> None:
    """fsync a file or a directory (its entries) by path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(folder: Path) -> None:
    for child in folder.iterdir():
        if child.is_file():
            _fsync_path(child)
        elif child.is_dir():
            _fsync_tree(child)
    _fsync_path(folder)


_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def _as_os_error(e: BaseException, where: Path) -> BaseException:
    """An I/O failure as an ``OSError`` naming ``where``. safetensors reports a failed write as its own
    ``SafetensorError`` whose text ends in Rust's ``(os error N)``; that number is the only errno it gives."""
    if isinstance(e, OSError):
        return e if e.filename or e.errno is None else OSError(e.errno, e.strerror, str(where))
    match = _RUST_OS_ERROR.search(str(e))
    if match is None:
        return e
    number = int(match.group(1))
    return OSError(number, os.strerror(number), str(where))


def committed(path: Path) -> Path | None:
    """The complete checkpoint to read for ``path``: ``path`` itself, or ``path.old`` when a switch was cut
    between its two renames; None when neither holds a state file."""
    for candidate in (path, path.with_name(path.name + ".old")):
        if (candidate / STATE_FILE).is_file():
            return candidate
    return None


def save_checkpoint(
    path: Path,
    model: Any,
    optimizer: torch.optim.Optimizer | None,
    step: int,
    extra: dict[str, Any],
    files: CheckpointFiles | None = None,
    sharded: torch.nn.Module | None = None,
    world: World = SINGLE,
) -> Path:
    """Write ``path`` (a folder) atomically and durably: model safetensors + config, optimizer, RNG states,
    step, ``extra`` (tensors and plain containers only) and ``files`` (the run's tokenizer and config, see
    :mod:`.checkpoint_files`) when given. Under torchrun (``world``), ``sharded`` is the trained module whose
    shards, with ``optimizer``'s, go to ``sharded/`` (a collective: every rank calls this)."""
    if world.distributed and sharded is not None and optimizer is not None:
        return _save_distributed(path, model, optimizer, step, extra, files, sharded, world)
    tmp = _fresh_tmp(path)
    state = _trainer_state(step, optimizer.state_dict() if optimizer is not None else None, extra)
    _write(tmp, model, files, state)
    return _switch(tmp, path)


def _save_distributed(
    path: Path,
    model: Any,
    optimizer: torch.optim.Optimizer,
    step: int,
    extra: dict[str, Any],
    files: CheckpointFiles | None,
    sharded: torch.nn.Module,
    world: World,
) -> Path:
    """:func:`save_checkpoint` under torchrun: every rank its DCP shard, rank 0 the rest and the switch."""
    tmp = path.with_name(path.name + ".tmp")
    if world.is_main:
        _fresh_tmp(path)
    barrier(world)
    try:
        save_sharded(tmp / SHARDED_DIR, sharded, optimizer)
    except BaseException as e:
        raise _as_os_error(e, tmp) from e
    barrier(world)  # every shard is on disk before rank 0 seals the folder
    if world.is_main:
        _write(tmp, model, files, _trainer_state(step, None, {"sharded": True, **extra}))
        _switch(tmp, path)
    barrier(world)
    return path


def _fresh_tmp(path: Path) -> Path:
    """An empty ``NAME.tmp`` beside ``path`` (a stray one from a crash is removed)."""
    tmp = path.with_name(path.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    return tmp


def _trainer_state(step: int, optimizer: dict[str, Any] | None, extra: dict[str, Any]) -> dict[str, Any]:
    """The state beside the weights; with CUDA, every visible GPU's RNG state too (``rng_cuda``, one byte tensor
    per device: dropout and sampling on a GPU draw from it), absent without CUDA as in older checkpoints."""
    return {"step": step, "optimizer": optimizer, **Rngs.capture().to_plain(), **extra}


def _write(tmp: Path, model: Any, files: CheckpointFiles | None, state: dict[str, Any]) -> None:
    """Model, run files and trainer state into ``tmp``, all fsynced; on failure ``tmp`` is removed."""
    try:
        save_model(model, tmp)
        if files is not None:
            files.write(tmp)
        with (tmp / STATE_FILE).open("wb") as fh:  # a Python file: a failed write is an OSError naming its cause
            torch.save(state, fh)
        _fsync_tree(tmp)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)  # on a full disk, the half-written copy holds the space a retry needs
        raise _as_os_error(e, tmp) from e


def _switch(tmp: Path, path: Path) -> Path:
    """Replace ``path`` by the complete ``tmp`` with two renames (see the module docstring)."""
    old = path.with_name(path.name + ".old")
    if path.exists():
        if old.exists():  # left by a crash after the switch, before its removal: ``path`` is the newer one
            shutil.rmtree(old)
        os.replace(path, old)
    # else: first save, or a switch cut before its second rename (then ``old`` is the good one: keep it)
    os.replace(tmp, path)
    _fsync_path(path.parent)
    if old.exists():
        shutil.rmtree(old)
    return path


def load_state(folder: Path) -> dict[str, Any]:
    """``folder``'s trainer state, read as data (``weights_only=True``); one-line :class:`CheckpointError` if it
    is missing, unreadable, or asks to run code while loading."""
    path = folder / STATE_FILE
    if not path.is_file():
        raise CheckpointError(f"'{folder}' is not a training checkpoint (no {STATE_FILE} inside)")
    try:
        state = torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as e:
        raise CheckpointError(
            f"refusing to load '{path}': it is not plain checkpoint data (it asks to run code or build objects "
            "while loading, which a harmonyrl checkpoint never does)"
        ) from e
    except Exception as e:  # truncated, not a torch file, unreadable: say which file, keep the cause
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"cannot read '{path}': {first}") from e
    if not isinstance(state, dict) or isinstance(state.get("step"), bool) or not isinstance(state.get("step"), int):
        raise CheckpointError(f"'{path}' is not a harmonyrl trainer state (no step)")
    return state
