"""Sandboxed execution of model-written Python (bubblewrap: no network, read-only root, private /tmp, rlimits).

    from harmonyrl.sandbox import SandboxLimits, run_python

    result = await run_python("print(sum(range(10)))", SandboxLimits(timeout_s=5))
    result.status, result.stdout          # ("ok", "45\\n")

For environments, :func:`make_python_tool` wraps this as a ``python`` tool whose sandbox failures are
environment faults (``Failure("sandbox_error")``), never a wrong answer. How the isolation is built, and
what was measured to need it, is in :mod:`harmonyrl.sandbox.bwrap`.

The core is standard library only, so any interpreter can drive it; the tool (which needs pydantic through
:mod:`harmonyrl.envs.tools`) is imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from harmonyrl.sandbox.bwrap import check_sandbox
from harmonyrl.sandbox.limits import SandboxLimits, SandboxResult, SandboxUnavailable, Status, UnsafeExecutionWarning
from harmonyrl.sandbox.run import run_python

if TYPE_CHECKING:
    from harmonyrl.sandbox.tool import make_python_tool

__all__ = [
    "SandboxLimits",
    "SandboxResult",
    "SandboxUnavailable",
    "Status",
    "UnsafeExecutionWarning",
    "check_sandbox",
    "make_python_tool",
    "run_python",
]


def __getattr__(name: str) -> Any:
    if name == "make_python_tool":
        from harmonyrl.sandbox.tool import make_python_tool

        return make_python_tool
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
