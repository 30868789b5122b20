"""Shared pieces of the sandbox tests: tight limits, the measured availability of bubblewrap, a host process scan.

Under CI (``CI=true``, as ``.ci/run`` sets it) nothing here skips: a machine without a working bubblewrap
(or cgroup, or an unprivileged user to test the non-root mode with) fails the battery instead of passing
it by skipping it.
"""

from __future__ import annotations

import asyncio
import os
import threading
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


IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
BWRAP_CAUSE = _cause()
needs_bwrap = pytest.mark.skipif(
    BWRAP_CAUSE is not None and not IN_CI, reason=f"bubblewrap cannot sandbox on this machine (measured): {BWRAP_CAUSE}"
)


def skip_unless(condition: bool, reason: str) -> pytest.MarkDecorator:
    """Skip when ``condition`` is False, except under CI, where the test runs (and fails loudly)."""
    return pytest.mark.skipif(not condition and not IN_CI, reason=reason)


def mem_available_mib() -> int:
    """The host's MemAvailable (``/proc/meminfo``), in MiB."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) >> 10
    raise RuntimeError("no MemAvailable in /proc/meminfo")


class LowestMemAvailable:
    """Samples MemAvailable every 20 ms in a thread while the ``with`` block runs; ``before``/``lowest``/``after``."""

    def __init__(self) -> None:
        self.before = self.lowest = self.after = mem_available_mib()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.lowest = min(self.lowest, mem_available_mib())

    def __enter__(self) -> LowestMemAvailable:
        self.before = self.lowest = mem_available_mib()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.after = mem_available_mib()
        self.lowest = min(self.lowest, self.after)

    def __str__(self) -> str:
        drop = self.before - self.lowest
        return f"MemAvailable MiB: before {self.before}, lowest during {self.lowest}, after {self.after} (drop {drop})"


def run(code: str, limits: SandboxLimits = LIMITS, **kwargs: object) -> SandboxResult:
    return asyncio.run(run_python(code, limits, **kwargs))  # type: ignore[arg-type]


def fork_bomb(token: str) -> str:
    """A fork bomb whose processes carry ``token`` on their command line (other workers' sandboxes do not)."""
    bomb = "import os\\nwhile True:\\n    try:\\n        os.fork()\\n    except OSError:\\n        pass"
    return f"import os, sys\nos.execv(sys.executable, [sys.executable, '-c', '{bomb}', '{token}'])"


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
