"""The run's resumable state, typed: what ``checkpoints/last/trainer_state.pt`` holds besides the weights.

One :class:`RunState` is written by :func:`~harmonyrl.run.resume.save_progress` and read back, checked, by
:func:`~harmonyrl.run.resume.load_progress`; everything that resumes reads its attributes, never a string key
of a loose dict (before, each reader did ``state.get("faults", {})`` with its own idea of what was there). The file
format is unchanged — the same plain keys as before (``rng_torch``, ``sampling``, …), so checkpoints written
before this module load, and a crafted file still cannot run code (``torch.load(weights_only=True)``).

What each phase must have is checked once, here: both phases their ``lines`` (the tracked files' lengths, see
:mod:`.resume`) and RNG states; SFT its LR ``schedule``; RL its ``learner`` state. The optimizer may be absent
(``None``) only when a torchrun run kept it in ``sharded/``.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal, cast, get_args

import torch

from harmonyrl.errors import CheckpointError

Phase = Literal["sft", "rl"]
PHASES: tuple[Phase, ...] = get_args(Phase)


@dataclass(frozen=True, eq=False)
class Rngs:
    """Every random generator a step draws from: torch's CPU one, Python's, and each visible GPU's (``cuda``;
    empty without CUDA, as in checkpoints written on a CPU)."""

    torch_state: torch.Tensor
    python_state: tuple[Any, ...]
    cuda: tuple[torch.Tensor, ...] = ()

    @staticmethod
    def capture() -> Rngs:
        cuda = tuple(torch.cuda.get_rng_state_all()) if torch.cuda.is_available() else ()
        return Rngs(torch.get_rng_state(), random.getstate(), cuda)

    def restore(self) -> None:
        """Set the generators. GPUs beyond those saved keep their seeded state; states beyond the GPUs present are
        not used."""
        torch.set_rng_state(self.torch_state)
        random.setstate(self.python_state)
        if self.cuda and torch.cuda.is_available():
            for device, state in enumerate(self.cuda[: torch.cuda.device_count()]):
                torch.cuda.set_rng_state(state, device)

    @staticmethod
    def from_plain(state: Mapping[str, Any]) -> Rngs:
        """The generators of a checkpoint's plain keys (``rng_torch``, ``rng_python``, ``rng_cuda`` if saved)."""
        return Rngs(state["rng_torch"], state["rng_python"], tuple(state.get("rng_cuda") or ()))

    def to_plain(self) -> dict[str, Any]:
        cuda = {"rng_cuda": list(self.cuda)} if self.cuda else {}
        return {"rng_torch": self.torch_state, "rng_python": self.python_state, **cuda}


@dataclass(frozen=True)
class PhaseState:
    """What one phase adds to the state: SFT its LR ``schedule``; RL its ``learner`` (value head, soft-Q state),
    fault breaker (``faults``), task position (``sampling``), async ``pipeline``; both the run's seconds so far
    (``elapsed_s``). None: not part of this phase's state (or of a checkpoint written before it was kept)."""

    schedule: dict[str, Any] | None = None
    learner: dict[str, Any] | None = None
    faults: dict[str, Any] | None = None
    sampling: dict[str, Any] | None = None
    pipeline: dict[str, Any] | None = None
    elapsed_s: float | None = None

    def to_plain(self) -> dict[str, Any]:
        """The keys of the checkpoint file, those that are set."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


NO_PARTS = PhaseState()
"""A state with no phase-specific part (a test's or a tool's own checkpoint)."""


@dataclass(frozen=True, eq=False)
class RunState:
    """``step`` steps of ``phase`` are complete; ``lines``: how many lines each tracked file had then."""

    phase: Phase
    step: int
    lines: dict[str, int]
    rngs: Rngs
    optimizer: dict[str, Any] | None
    """The optimizer's state dict; None when a torchrun run saved it in ``sharded/`` (DCP)."""
    parts: PhaseState = NO_PARTS

    @staticmethod
    def from_plain(state: Mapping[str, Any], where: str) -> RunState:
        """Check and type a loaded ``trainer_state.pt``; a one-line :class:`CheckpointError` naming ``where``."""
        phase = state.get("phase")
        if phase not in PHASES:
            raise CheckpointError(f"resume state '{where}' has no valid phase (got {phase!r})")
        needs = {"sft": ("optimizer", "schedule"), "rl": ("optimizer", "learner")}[phase]
        missing = [k for k in (*needs, "lines", "rng_torch", "rng_python") if k not in state]
        lines = state.get("lines")
        if missing or not isinstance(lines, dict) or not all(isinstance(v, int) for v in lines.values()):
            raise CheckpointError(f"resume state '{where}' is incomplete (missing or invalid: {missing or ['lines']})")
        if not isinstance(state["rng_torch"], torch.Tensor) or not isinstance(state["rng_python"], tuple):
            raise CheckpointError(f"resume state '{where}' has invalid RNG states")
        for name in ("optimizer", "schedule", "learner", "sampling", "pipeline", "faults"):
            if state.get(name) is not None and not isinstance(state[name], dict):
                raise CheckpointError(f"resume state '{where}' has an invalid {name} state")
        elapsed = state.get("elapsed_s")  # absent in checkpoints written before the run clock
        parts = PhaseState(
            schedule=state.get("schedule"),
            learner=state.get("learner"),
            faults=state.get("faults"),
            sampling=state.get("sampling"),
            pipeline=state.get("pipeline"),
            elapsed_s=float(elapsed) if isinstance(elapsed, int | float) and not isinstance(elapsed, bool) else None,
        )
        return RunState(cast(Phase, phase), int(state["step"]), dict(lines), Rngs.from_plain(state), state["optimizer"],
                        parts)  # fmt: skip
