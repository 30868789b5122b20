"""Sandboxed execution of model-written Python (bubblewrap: no network, read-only root, private /tmp, rlimits).

    from harmonyrl.sandbox import SandboxLimits, run_python

    result = await run_python("print(sum(range(10)))", SandboxLimits(timeout_s=5))
    result.status, result.stdout          # ("ok", "45\\n")

For environments, :func:`harmonyrl.envs.python_tool.make_python_tool` wraps this as a ``python`` tool whose
sandbox failures are environment faults (``Failure("sandbox_error")``), never a wrong answer. How the
isolation is built, and what was measured to need it, is in :mod:`harmonyrl.sandbox.bwrap`.

A leaf package: standard library only and nothing else from harmonyrl, so any interpreter can drive it.
"""

from __future__ import annotations

from harmonyrl.sandbox.bwrap import check_sandbox
from harmonyrl.sandbox.limits import SandboxLimits, SandboxResult, SandboxUnavailable, Status, UnsafeExecutionWarning
from harmonyrl.sandbox.run import run_python

__all__ = [
    "SandboxLimits",
    "SandboxResult",
    "SandboxUnavailable",
    "Status",
    "UnsafeExecutionWarning",
    "check_sandbox",
    "run_python",
]
