"""Lossless resume: ``checkpoints/last`` holds everything needed to continue a run exactly where it stopped.

Written atomically (see :mod:`.checkpoint`) after every RL step and every ``sft.checkpoint_every`` SFT steps:
model weights, optimizer (and LR schedule), the learner's extra state (value head, soft-Q temperature and
replay buffer), every RNG, the phase and step, and how many lines ``metrics.jsonl`` and
``rollouts/episodes.jsonl`` had at that moment. A resume truncates those files back to that point — rows
written by the killed process after its last checkpoint are produced again, identically, so a run killed
at any moment and resumed ends with the same files as one that never stopped (``benchmarks/resume.py``).
Everything else a step needs is a function of the step index (task choice, sampling seeds) or lives in the
checkpoint, and the engine's sampling does not depend on batch composition.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from harmonyrl.errors import CheckpointError
from harmonyrl.trainer.checkpoint import save_checkpoint
from harmonyrl.trainer.checkpoint_files import CheckpointFiles

TRACKED_FILES = ("metrics.jsonl", "rollouts/episodes.jsonl")
Phase = Literal["sft", "rl"]


@dataclass(frozen=True)
class Progress:
    """A run's position: ``step`` steps of ``phase`` are complete and reflected in ``state``."""

    phase: Phase
    step: int
    state: dict[str, Any]
    model_dir: Path


def last_dir(run_dir: Path) -> Path:
    return run_dir / "checkpoints" / "last"


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.is_file() else 0


def save_progress(
    run_dir: Path,
    model: torch.nn.Module,
    phase: Phase,
    step: int,
    optimizer: torch.optim.Optimizer,
    files: CheckpointFiles | None = None,
    **extra: Any,
) -> None:
    """Atomically replace ``checkpoints/last`` with the state after ``step`` completed steps of ``phase``."""
    lines = {name: _lines(run_dir / name) for name in TRACKED_FILES}
    save_checkpoint(last_dir(run_dir), model, optimizer, step, {"phase": phase, "lines": lines, **extra}, files)


def load_progress(run_dir: Path) -> Progress | None:
    """The last saved position of ``run_dir``, or None if the run never got past its first checkpoint."""
    path = last_dir(run_dir)
    if not (path / "trainer_state.pt").is_file():
        return None
    try:
        state = torch.load(path / "trainer_state.pt", weights_only=False)
    except Exception as e:  # truncated or foreign file: say which, keep the cause
        raise CheckpointError(f"cannot read resume state '{path}': {str(e).splitlines()[0]}") from e
    if state.get("phase") not in ("sft", "rl") or not isinstance(state.get("step"), int):
        raise CheckpointError(f"resume state '{path}' has no valid phase/step")
    return Progress(state["phase"], state["step"], state, path)


def rewind_files(run_dir: Path, progress: Progress | None) -> None:
    """Cut the tracked files back to their length at ``progress`` (to nothing if there is none)."""
    lines = progress.state["lines"] if progress is not None else {}
    for name in TRACKED_FILES:
        path = run_dir / name
        if not path.is_file():
            continue
        keep, data = lines.get(name, 0), path.read_bytes()
        cut = 0
        for _ in range(keep):
            cut = data.index(b"\n", cut) + 1
        path.write_bytes(data[:cut])


def restore_rngs(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["rng_torch"])
    random.setstate(state["rng_python"])
