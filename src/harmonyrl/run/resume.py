"""Lossless resume: ``checkpoints/last`` holds everything needed to continue a run exactly where it stopped.

Written atomically (see :mod:`.checkpoint`) after every RL step and every ``sft.checkpoint_every`` SFT steps:
model weights, optimizer (and LR schedule), the learner's extra state (value head, soft-Q temperature and
replay buffer), the fault breaker's streak, every RNG, the phase and step, the seconds the run had spent
(:mod:`.run_clock`), and how many lines ``metrics.jsonl`` and ``rollouts/episodes.jsonl`` had at that moment
(fsynced first, so the checkpoint never counts a row that a power cut could lose). A resume truncates those
files back to that point — rows written by the killed process after its last checkpoint are produced again,
identically, so a run killed at any moment and resumed ends with the same files as one that never stopped
(``benchmarks/resume.py``).
Everything else a step needs is a function of the step index (task choice, sampling seeds) or lives in the
checkpoint, and the engine's sampling does not depend on batch composition.

**A failed resume changes nothing** (invariant 7). Reading is split from writing: :func:`load_progress` and
:func:`plan_rewind` check the state and every tracked file (present, long enough, UTF-8 JSON lines up to the
cut, the evaluation before RL recorded, the folder writable) and raise a one-line ``CheckpointError`` before
:func:`rewind_files` truncates anything.

**Across world sizes.** A checkpoint written under torchrun keeps the optimizer in ``sharded/`` (DCP), which
:func:`load_optimizer` reshards to any world size, one process included; a single-process checkpoint's optimizer
is scattered onto the shards of a torchrun resume. The weights are always read from ``model.safetensors``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from harmonyrl.distributed.fsdp import SHARDED_DIR, load_full_optimizer, load_sharded
from harmonyrl.distributed.world import SINGLE, World
from harmonyrl.errors import CheckpointError
from harmonyrl.run.checkpoint import committed, load_state, save_checkpoint
from harmonyrl.run.checkpoint_files import CheckpointFiles
from harmonyrl.run.state import NO_PARTS, Phase, PhaseState, RunState

TRACKED_FILES = ("metrics.jsonl", "rollouts/episodes.jsonl")


@dataclass(frozen=True)
class Progress:
    """A run's position: ``step`` steps of ``phase`` are complete and reflected in ``state``, read from
    ``model_dir``."""

    state: RunState
    model_dir: Path

    @property
    def phase(self) -> Phase:
        return self.state.phase

    @property
    def step(self) -> int:
        return self.state.step


def last_dir(run_dir: Path) -> Path:
    return run_dir / "checkpoints" / "last"


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.is_file() else 0


def _fsync(path: Path) -> None:
    if path.is_file():
        with path.open("rb") as fh:
            os.fsync(fh.fileno())


def save_progress(
    run_dir: Path,
    model: torch.nn.Module,
    phase: Phase,
    step: int,
    optimizer: torch.optim.Optimizer,
    files: CheckpointFiles | None = None,
    *,
    sharded: torch.nn.Module | None = None,
    world: World = SINGLE,
    parts: PhaseState = NO_PARTS,
) -> None:
    """Atomically replace ``checkpoints/last`` with the state after ``step`` completed steps of ``phase``, with
    the phase's own ``parts`` (:class:`~harmonyrl.run.state.PhaseState`).

    Under torchrun a collective: ``sharded`` is the trained module (see :func:`.checkpoint.save_checkpoint`);
    only rank 0 counts the tracked files, which only it writes."""
    lines: dict[str, int] = {}
    if world.is_main:
        for name in TRACKED_FILES:
            _fsync(run_dir / name)
        lines = {name: _lines(run_dir / name) for name in TRACKED_FILES}
    extra = {"phase": phase, "lines": lines, **parts.to_plain()}
    save_checkpoint(last_dir(run_dir), model, optimizer, step, extra, files, sharded, world)


def load_optimizer(
    saved: Progress,
    plain: torch.nn.Module,
    trained: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    world: World = SINGLE,
) -> None:
    """Restore ``optimizer`` (over ``trained``'s parameters) from ``saved``: its DCP shards when a torchrun run
    wrote it (resharded to this world size), else the single-process state — scattered onto the shards under
    torchrun (``plain`` is the unsharded model it was saved for)."""
    shards = saved.model_dir / SHARDED_DIR
    if shards.is_dir():
        load_sharded(shards, trained, optimizer)
    elif saved.state.optimizer is None:
        raise CheckpointError(f"'{saved.model_dir}' holds no optimizer state (neither {SHARDED_DIR}/ nor inline)")
    elif world.distributed:
        load_full_optimizer(plain, saved.state.optimizer, trained, optimizer)
    else:
        optimizer.load_state_dict(saved.state.optimizer)


def load_progress(run_dir: Path) -> Progress | None:
    """The last saved position of ``run_dir``, or None if the run never got past its first checkpoint.

    Reads ``checkpoints/last``, or ``last.old`` when a save was cut between its two renames."""
    folder = committed(last_dir(run_dir))
    if folder is None:
        return None
    return Progress(RunState.from_plain(load_state(folder), str(folder)), folder)


def _cut_of(run_dir: Path, name: str, keep: int, where: str) -> int:
    """Byte offset just after line ``keep`` of tracked file ``name``, checked: present, at least ``keep`` complete
    lines, those lines UTF-8 JSON. A torn or garbled tail after them is what the rewind removes."""
    path = run_dir / name
    if keep == 0:
        return 0
    if not path.is_file():
        raise CheckpointError(f"cannot resume: '{path}' is missing but {where} recorded {keep} lines of it")
    data = path.read_bytes()
    cut = 0
    for number in range(1, keep + 1):
        end = data.find(b"\n", cut)
        if end < 0:
            raise CheckpointError(
                f"cannot resume: '{path}' has {number - 1} complete lines but {where} recorded {keep}: "
                "it was truncated or replaced after the checkpoint"
            )
        try:
            json.loads(data[cut:end].decode("utf-8"))
        except UnicodeDecodeError as e:
            raise CheckpointError(f"cannot resume: '{path}' line {number} is not UTF-8 text ({e.reason})") from None
        except ValueError as e:
            raise CheckpointError(f"cannot resume: '{path}' line {number} is not a JSON row ({e})") from None
        cut = end + 1
    return cut


def _has_eval_before_rl(data: bytes) -> bool:
    rows = (json.loads(line) for line in data.decode("utf-8").splitlines())
    return any(isinstance(row, dict) and row.get("phase") == "eval" and row.get("step") == 0 for row in rows)


def plan_rewind(run_dir: Path, progress: Progress | None) -> dict[str, int]:
    """Where each tracked file will be cut (byte offsets), after checking that the cut is possible and the
    folder writable. Changes nothing; raises a one-line ``CheckpointError`` for a folder it cannot resume."""
    lines = progress.state.lines if progress is not None else {}
    where = f"the checkpoint at {progress.phase} step {progress.step}" if progress is not None else ""
    cuts = {name: _cut_of(run_dir, name, lines.get(name, 0), where) for name in TRACKED_FILES}
    if progress is not None and progress.phase == "rl":
        metrics = run_dir / "metrics.jsonl"
        if not _has_eval_before_rl(metrics.read_bytes()[: cuts["metrics.jsonl"]] if metrics.is_file() else b""):
            raise CheckpointError(f"cannot resume RL: '{metrics}' has no evaluation before RL (step 0)")
    for folder in (run_dir, run_dir / "checkpoints"):
        if folder.is_dir() and not os.access(folder, os.W_OK):
            raise CheckpointError(f"cannot resume: '{folder}' is not writable (read-only or no permission)")
    for name in TRACKED_FILES:
        path = run_dir / name
        if path.is_file() and not os.access(path, os.W_OK):
            raise CheckpointError(f"cannot resume: '{path}' is not writable (read-only or no permission)")
    return cuts


def rewind_files(run_dir: Path, cuts: dict[str, int]) -> None:
    """Cut the tracked files at the offsets of :func:`plan_rewind` (truncation only: it cannot fill a disk)."""
    for name, cut in cuts.items():
        path = run_dir / name
        if path.is_file() and path.stat().st_size != cut:
            os.truncate(path, cut)
