"""How a run that fails after its folder exists says so: one line for the console, the traceback in the folder.

Three kinds of failure reach here. A run folder that cannot be written (disk full, quota, read-only, no
permission) is the user's to fix: it becomes a :class:`RunFolderError` whose one line says what the folder still
holds (the last complete checkpoint and the rows up to it) and how to continue. A vLLM server that stayed down
past ``rollout.engine.restart_wait_s`` (or kept failing) is the operator's to bring back: an
:class:`EngineStopped`, one line of the same shape. Anything else that is not a user error — a parser or trainer
exception — is the harness's: its traceback is appended to ``RUN_DIR/error.log`` and a note on the exception
names that file, so the command prints one line that points at it (or, when even that file cannot be written,
the traceback goes to stderr). An :class:`EngineStopped`'s traceback goes to ``error.log`` too.
"""

from __future__ import annotations

import errno
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from harmonyrl.engine.vllm import EngineFailure
from harmonyrl.errors import CheckpointError
from harmonyrl.run.resume import load_progress

STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})
"""OS errors that mean "this folder cannot take more writes", not a bug."""
LOG_NAME = "error.log"
TRACEBACK_NOTE = "traceback in "


class RunFolderError(RuntimeError):
    """The run folder cannot be written (full, read-only, no permission); the message is one line."""


class EngineStopped(RuntimeError):
    """The rollout server failed a step after every retry and wait; the message is one line."""


def is_storage_error(e: BaseException) -> bool:
    """An ``OSError`` whose errno says the storage refused the write."""
    return isinstance(e, OSError) and e.errno in STORAGE_ERRNOS


def kept(run_dir: Path, first: str = "free space") -> str:
    """What the run folder still holds that a resume continues from, in a few words; ``first``: what the user
    does before resuming."""
    try:
        saved = load_progress(run_dir)
    except CheckpointError:
        saved = None
    if saved is None:
        return "no resumable checkpoint was written yet (start the run again)"
    return (
        f"'{saved.model_dir}' holds {saved.phase} step {saved.step} and the rows up to it are kept "
        f"({first}, then: harmonyrl train --resume {run_dir})"
    )


def storage_message(e: OSError, run_dir: Path | None) -> str:
    """One line: which write failed and why, and (with ``run_dir``) what the run folder kept."""
    where = f" '{e.filename}'" if e.filename else (f" in '{run_dir}'" if run_dir is not None else "")
    reason = e.strerror or errno.errorcode.get(e.errno or 0, str(e))
    line = f"cannot write{where}: {reason}"
    return line if run_dir is None else f"{line}; {kept(run_dir)}"


def log_failure(run_dir: Path, e: BaseException) -> Path | None:
    """Append ``e``'s traceback to ``RUN_DIR/error.log``; returns the log, or None when it cannot be written."""
    log = run_dir / LOG_NAME
    text = "".join(traceback.format_exception(e))
    try:
        with log.open("a", encoding="utf-8") as fh:
            fh.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} ---\n{text}")
    except OSError:
        return None
    return log


@contextmanager
def run_failures(run_dir: Path) -> Iterator[None]:
    """Around a run's work: storage errors become :class:`RunFolderError`, an engine that failed its retries an
    :class:`EngineStopped`; any other exception is logged to ``error.log`` (a note on it names the file) and
    re-raised unchanged."""
    try:
        yield
    except Exception as e:
        if is_storage_error(e):
            raise RunFolderError(storage_message(e, run_dir)) from e  # type: ignore[arg-type]
        log = log_failure(run_dir, e)
        if isinstance(e, EngineFailure):
            line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise EngineStopped(f"{line}; {kept(run_dir, 'bring the server back')}") from e
        if log is not None:
            e.add_note(f"{TRACEBACK_NOTE}'{log}'")
        raise
