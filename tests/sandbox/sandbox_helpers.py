"""Shared pieces of the sandbox tests: tight limits, the measured availability of bubblewrap, a host process scan."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable

import pytest

from harmonyrl.sandbox import SandboxLimits, SandboxResult, SandboxUnavailable, check_sandbox, run_python

LIMITS = SandboxLimits(
    timeout_s=5, cpu_s=5, memory_mib=256, max_processes=16, max_file_mib=1, tmp_mib=8, max_output_bytes=4096
)
SLACK_S = 1.5  # the dev machine runs benchmarks on both cores while these tests run


def _cause() -> str | None:
    try:
        check_sandbox()
    except SandboxUnavailable as e:
        return str(e)
    return None


BWRAP_CAUSE = _cause()
needs_bwrap = pytest.mark.skipif(
    BWRAP_CAUSE is not None, reason=f"bubblewrap cannot sandbox on this machine (measured): {BWRAP_CAUSE}"
)


def run(code: str, limits: SandboxLimits = LIMITS, **kwargs: object) -> SandboxResult:
    return asyncio.run(run_python(code, limits, **kwargs))  # type: ignore[arg-type]


def pids_with(token: str) -> list[int]:
    """Host processes whose command line contains ``token`` (seen from outside any sandbox)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if token.encode() in f.read():
                        found.append(int(entry))
            except OSError:
                continue  # exited while we looked
    return found


def eventually(predicate: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()
