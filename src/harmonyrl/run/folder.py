"""Run folders that hold nothing yet: what a failed start leaves behind, and what ``--overwrite`` replaces.

A run that fails before its first step (a bad env config, Ctrl-C during the demonstrations, an engine that
cannot start) leaves a folder with only ``config.yaml`` in it, which would block the name from being used
again. :func:`discard_if_unstarted` removes such a folder — one this invocation created, holding no metrics
row and no checkpoint. Anything that got further is kept: it can be continued (``--resume``) or replaced on
purpose (``--overwrite``), never deleted behind the user's back.

Light on imports on purpose: the command line uses it before loading torch.
"""

from __future__ import annotations

import json
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


def completed(run_dir: Path) -> tuple[str, int] | None:
    """``("RL", 7)`` when the last training row of ``run_dir/metrics.jsonl`` is RL step 7 (``("SFT", n)``: n SFT
    steps done), None when there is none: where an interrupted run got to. A line cut mid-write is skipped."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return None
    for line in reversed(path.read_text(encoding="utf-8", errors="replace").splitlines()):
        try:
            row = json.loads(line)
        except ValueError:
            continue
        step = row.get("step") if isinstance(row, dict) else None
        if isinstance(step, int) and row.get("phase") == "rl":
            return "RL", step
        if isinstance(step, int) and row.get("phase") == "sft":
            return "SFT", step + 1  # SFT rows count from 0
    return None


def interrupted_message(run_dir: Path, command: str) -> str:
    """What Ctrl-C says: where the run got to and the command that continues it, or that nothing was kept."""
    if not run_dir.is_dir():
        return "interrupted before the first step: nothing to resume (the run folder was removed)"
    done = completed(run_dir)
    where = f"after {done[0]} step {done[1]}" if done is not None else "before the first step"
    return f"interrupted {where}; resume with: harmonyrl {command} --resume {run_dir}"


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
