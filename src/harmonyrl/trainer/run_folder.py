"""Run folders that hold nothing yet: what a failed start leaves behind, and what ``--overwrite`` replaces.

A run that fails before its first step (a bad env config, Ctrl-C during the demonstrations, an engine that
cannot start) leaves a folder with only ``config.yaml`` in it, which would block the name from being used
again. :func:`discard_if_unstarted` removes such a folder — one this invocation created, holding no metrics
row and no checkpoint. Anything that got further is kept: it can be continued (``--resume``) or replaced on
purpose (``--overwrite``), never deleted behind the user's back.

Light on imports on purpose: the command line uses it before loading torch.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def default_run_name() -> str:
    """The run name when none is given: the local time the run started."""
    return time.strftime("%Y%m%d-%H%M%S")


def has_progress(run_dir: Path) -> bool:
    """True once a run holds anything worth keeping: a metrics row or a checkpoint (complete or not)."""
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file() and metrics.stat().st_size > 0:
        return True
    checkpoints = run_dir / "checkpoints"
    return checkpoints.is_dir() and any(checkpoints.iterdir())


@contextmanager
def discard_if_unstarted(run_dir: Path) -> Iterator[None]:
    """Run the block; if it raises (Ctrl-C included) and ``run_dir`` did not exist before it and holds no
    progress (:func:`has_progress`), remove ``run_dir`` so that its name can be used again."""
    existed = run_dir.exists()
    try:
        yield
    except BaseException:
        if not existed and run_dir.is_dir() and not has_progress(run_dir):
            shutil.rmtree(run_dir, ignore_errors=True)
        raise


def clear_for_overwrite(run_dir: Path) -> None:
    """Delete an earlier run's folder (``--overwrite``). Only a run folder (one with ``config.yaml``): a typo
    in ``output_dir``/``run_name`` must not wipe an unrelated folder."""
    if not (run_dir / "config.yaml").is_file():
        raise FileExistsError(
            f"'{run_dir}' exists and is not a run folder (no config.yaml); --overwrite only replaces run folders"
        )
    shutil.rmtree(run_dir)
