"""Optional metrics writers next to the always-on :class:`~harmonyrl.telemetry.metrics.JsonlWriter`.

TensorBoard and Weights & Biases are optional extras, never hard dependencies: the JSONL file is the record
of a run (the HTML report reads it), these writers only mirror it into tools people already watch. Their
packages are imported when a writer is built, so importing this module costs nothing and a missing package is
a :class:`WriterUnavailableError` naming what to install, raised before training starts.

Every writer has the ``JsonlWriter`` interface — ``write(step, metrics, phase)`` and ``close()`` — and
:class:`MultiWriter` fans one write out to several. ``phase`` matters for step axes: SFT counts its own steps
from 0, while RL and held-out evaluation share the RL step axis (an ``eval`` row at step N is the policy
after N RL steps). Keys are already namespaced (``sft/``, ``rollout/``, ``train/`` …), so they are the tags.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

from harmonyrl.errors import UserError


class WriterUnavailableError(UserError, ImportError):
    """An optional writer was requested but its package is not installed."""


class MetricsWriter(Protocol):
    def write(self, step: int, metrics: Mapping[str, float], phase: str) -> None: ...

    def close(self) -> None: ...


def _axis(phase: str) -> str:
    return "sft/step" if phase == "sft" else "rl/step"


class TensorBoardWriter:
    """Scalars into TensorBoard event files under ``log_dir`` (usually the run folder).

    Flushed on every write, like the JSONL writer, so a crashed run still shows its last step and
    ``tensorboard --logdir RUN_DIR`` can follow a live run.
    """

    def __init__(self, log_dir: Path) -> None:
        try:
            import tensorboard  # noqa: F401  torch's wrapper raises a vaguer error without it
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise WriterUnavailableError(
                "the TensorBoard writer needs the optional 'tensorboard' package: "
                "pip install 'harmonyrl[tensorboard]' (or: pip install tensorboard)"
            ) from e
        self.log_dir = log_dir
        self._writer = SummaryWriter(log_dir=str(log_dir))

    def write(self, step: int, metrics: Mapping[str, float], phase: str) -> None:
        for key, value in metrics.items():
            self._writer.add_scalar(key, float(value), global_step=step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbWriter:
    """Weights & Biases logging; ``mode="offline"`` (the default) needs no account and no network.

    Offline runs land in ``run_dir/wandb/offline-run-*`` and can be uploaded later with ``wandb sync``.
    W&B insists on one increasing step per run, but SFT and RL restart their counts, so each key is bound
    to its own step metric (``sft/step`` or ``rl/step``) instead of passing ``step=``. Console capture is off:
    a metrics writer should not rewrite the process's stdout (it would fight the live progress bars).
    ±inf is logged as NaN (a gap in W&B charts, which cannot draw infinities); the JSONL file keeps the value.
    """

    def __init__(
        self,
        run_dir: Path,
        run_name: str,
        config: Mapping[str, Any] | None = None,
        project: str = "harmonyrl",
        mode: Literal["offline", "online", "disabled"] = "offline",
    ) -> None:
        try:
            import wandb
        except ImportError as e:
            raise WriterUnavailableError(
                "the Weights & Biases writer needs the optional 'wandb' package: "
                "pip install 'harmonyrl[wandb]' (or: pip install wandb)"
            ) from e
        self._run = wandb.init(
            project=project,
            name=run_name,
            dir=str(run_dir),
            mode=mode,
            config=dict(config) if config is not None else None,
            settings=wandb.Settings(console="off"),
        )
        self._bound: set[str] = set()

    def write(self, step: int, metrics: Mapping[str, float], phase: str) -> None:
        axis = _axis(phase)
        if axis not in self._bound:
            self._run.define_metric(axis)
            self._bound.add(axis)
        row: dict[str, float] = {axis: float(step)}
        for key, value in metrics.items():
            if key not in self._bound:
                self._run.define_metric(key, step_metric=axis)
                self._bound.add(key)
            row[key] = float(value) if math.isfinite(value) else float("nan")
        self._run.log(row)

    def close(self) -> None:
        self._run.finish()


class MultiWriter:
    """Writes to every writer; ``close`` closes all of them even if one fails, then re-raises the first error."""

    def __init__(self, writers: Sequence[MetricsWriter]) -> None:
        self.writers = list(writers)

    def write(self, step: int, metrics: Mapping[str, float], phase: str) -> None:
        for writer in self.writers:
            writer.write(step, metrics, phase)

    def close(self) -> None:
        first: BaseException | None = None
        for writer in self.writers:
            try:
                writer.close()
            except Exception as e:  # keep closing: the other files must still be flushed
                first = first or e
        if first is not None:
            raise first
