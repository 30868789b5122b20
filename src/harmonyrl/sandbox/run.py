"""Run model-written Python in the sandbox: bounded time, bounded output, nothing left behind.

The process is started in a session of its own and its whole process group is SIGKILLed on every way
out: normal end, timeout, output overflow, and cancellation of the awaiting task (an episode's wall-clock
budget must reach running code). Under bubblewrap that kills the sandbox's pid namespace, so even processes
the code started in new sessions die with it; the unsafe fallback has no such guarantee.

Output is read in chunks against one shared byte budget for stdout + stderr, so a snippet printing
gigabytes costs at most the budget in memory; the first byte past the budget stops the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import sys
import time
import warnings
from dataclasses import dataclass

from harmonyrl.sandbox.bwrap import Launch, check_sandbox, prepare
from harmonyrl.sandbox.limits import (
    NOTHING_HIDDEN,
    Enforcement,
    Hidden,
    SandboxLimits,
    SandboxResult,
    SandboxUnavailable,
    Status,
    UnsafeExecutionWarning,
)

DEFAULT_LIMITS = SandboxLimits()
_CHUNK = 1 << 16
_REAP_S = 5.0  # after SIGKILL everything is gone within milliseconds; this only bounds a pathological wait


async def run_python(
    code: str,
    limits: SandboxLimits = DEFAULT_LIMITS,
    *,
    stdin: str = "",
    allow_unsafe: bool = False,
    bwrap: str | None = None,
    python: str | None = None,
    hidden: Hidden = NOTHING_HIDDEN,
) -> SandboxResult:
    """Run ``code`` as a Python program under bubblewrap and report what happened.

    Args:
        code: The program, run as ``/tmp/main.py`` with ``python -I -u``.
        limits: Resource limits; network is always off.
        stdin: Text fed to the program's standard input (then closed).
        allow_unsafe: Without a working bubblewrap, run the code anyway as a plain local process with the
            same rlimits (no isolation at all: only for trusted code or throwaway machines).
        bwrap: Path of the bubblewrap binary (default: ``bwrap`` on PATH).
        python: Interpreter for the code (default: this one). Its install is mounted read-only.
        hidden: Paths absent from the code's view (:func:`harmonyrl.sandbox.view.stdlib_only` finds them).

    Raises:
        SandboxUnavailable: bubblewrap is missing or cannot isolate here, and ``allow_unsafe`` is False or
            ``hidden`` is not empty (the unsafe fallback cannot hide anything).
    """
    python = python or sys.executable
    path: str | None
    try:
        path = await asyncio.to_thread(check_sandbox, bwrap, python)
    except SandboxUnavailable as e:
        if not allow_unsafe or hidden:
            raise
        _warn_unsafe(str(e))
        path = None
    start = time.monotonic()
    try:
        with prepare(code, limits, bwrap=path, python=python, hidden=hidden) as launch:
            return await _execute(launch, stdin.encode("utf-8", errors="replace"), limits)
    except OSError as e:  # no process could be started at all (pipes, memfd, fork): the environment's fault
        detail = f"sandbox could not be set up: {e}"
        took, isolated = time.monotonic() - start, path is not None
        enforced: Enforcement = "rlimits" if isolated else "none"
        return SandboxResult("sandbox_failure", None, "", detail, took, False, isolated, enforced)


@functools.cache
def _warn_unsafe(reason: str) -> None:
    """Warn once per process (per reason): every later unsafe run is the same decision."""
    warnings.warn(
        f"running model code WITHOUT isolation because allow_unsafe=True: {reason}", UnsafeExecutionWarning, 3
    )


@dataclass
class _Output:
    """Collected output and the one budget both streams draw from."""

    left: int
    stdout: bytearray
    stderr: bytearray
    cut: str | None = None  # the stream that hit the limit


async def _execute(launch: Launch, stdin: bytes, limits: SandboxLimits) -> SandboxResult:
    start = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *launch.argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        pass_fds=launch.pass_fds,
        cwd=launch.cwd,
        env=launch.env,
        start_new_session=True,
    )
    output = _Output(limits.max_output_bytes, bytearray(), bytearray())
    timed_out = False
    try:
        await asyncio.wait_for(_communicate(proc, stdin, output), limits.timeout_s)
    except TimeoutError:
        timed_out = True
    finally:  # also on cancellation: kill first, then reap
        _kill(proc)
        await _reap(proc)
    duration = time.monotonic() - start
    status, exit_code = _classify(launch.started(), timed_out, output.cut is not None, proc.returncode)
    stdout, stderr = _decode(output, limits.max_output_bytes)
    if status == "sandbox_failure":
        reason = f"did not start within {limits.timeout_s:g}s" if timed_out else f"exit {proc.returncode}"
        stderr = f"sandbox failed to start ({reason}): {stderr.strip()}"
    truncated = output.cut is not None
    return SandboxResult(status, exit_code, stdout, stderr, duration, truncated, launch.isolated, launch.enforcement)


async def _communicate(proc: asyncio.subprocess.Process, stdin: bytes, output: _Output) -> None:
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    await asyncio.gather(
        _feed(proc.stdin, stdin),
        _pump(proc, proc.stdout, output, "stdout"),
        _pump(proc, proc.stderr, output, "stderr"),
    )
    await proc.wait()


async def _feed(pipe: asyncio.StreamWriter, data: bytes) -> None:
    try:
        if data:
            pipe.write(data)
            await pipe.drain()
    except (BrokenPipeError, ConnectionResetError):
        pass  # the program exited without reading all of its input: its business
    finally:
        pipe.close()


async def _pump(proc: asyncio.subprocess.Process, stream: asyncio.StreamReader, output: _Output, name: str) -> None:
    """Copy ``stream`` into ``output`` until EOF; past the budget, stop the process and discard the rest."""
    buf = output.stdout if name == "stdout" else output.stderr
    while chunk := await stream.read(_CHUNK):
        take = min(len(chunk), output.left)
        buf += chunk[:take]
        output.left -= take
        if take < len(chunk) and output.cut is None:
            output.cut = name
            _kill(proc)


def _kill(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL the process group (the session started for the run; under bwrap it takes the pid namespace)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


async def _reap(proc: asyncio.subprocess.Process) -> None:
    """Wait for the killed process and drain its pipes; a second cancellation is deferred, not lost."""
    assert proc.stdout is not None and proc.stderr is not None
    drain = asyncio.gather(proc.wait(), _discard(proc.stdout), _discard(proc.stderr))
    try:
        await asyncio.wait_for(drain, _REAP_S)
    except TimeoutError:
        pass
    except asyncio.CancelledError:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), _REAP_S)
        raise


async def _discard(stream: asyncio.StreamReader) -> None:
    while await stream.read(_CHUNK):
        pass


def _classify(started: bool, timed_out: bool, overflow: bool, returncode: int | None) -> tuple[Status, int | None]:
    """Status and reported exit code. Signal deaths are reported as ``128 + signal``, as a shell would."""
    if not started:
        return "sandbox_failure", returncode
    if overflow:
        return "output_limit", None
    if timed_out or returncode is None:
        return "timeout", None
    code = 128 - returncode if returncode < 0 else returncode  # unsafe mode: -N for signal N
    if code > 128 and _is_signal(code - 128):  # (a program calling sys.exit(137) looks the same: bwrap's convention)
        return "killed", code
    return ("ok" if code == 0 else "error"), code


def _is_signal(number: int) -> bool:
    try:
        signal.Signals(number)
    except ValueError:
        return False
    return True


def _decode(output: _Output, cap: int) -> tuple[str, str]:
    marker = f"\n…[output truncated: stdout + stderr exceed {cap} bytes; the program was stopped]"
    out = output.stdout.decode("utf-8", errors="replace")
    err = output.stderr.decode("utf-8", errors="replace")
    if output.cut == "stdout":
        out += marker
    elif output.cut == "stderr":
        err += marker
    return out, err
