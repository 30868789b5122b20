"""The ``python`` tool: the model's code runs in the sandbox and its output comes back as JSON.

    toolbox = Toolbox([make_python_tool(SandboxLimits(timeout_s=5))])

Who is to blame decides what the model sees (invariant 5 of the architecture):

* everything the *code* did (``ok``, ``error``, ``timeout``, ``killed``, ``output_limit``) is an observation,
  ``{"status": …, "stdout": …, "stderr": …, "error": …}``: an infinite loop or a traceback is the model's
  own result to learn from;
* the sandbox failing to start is the environment's fault: the tool raises :class:`SandboxError`, an
  :class:`~harmonyrl.envs.tools.ToolInfraError` of kind ``sandbox_error``, so the episode is masked.
  The tool's own timeout (the sandbox's plus start-up slack) only fires if the sandbox itself hangs, and is
  a ``tool_timeout`` for the same reason; the cancellation it causes kills the sandbox.

Availability is checked when the tool is made, so a machine without bubblewrap fails at set-up, not as a
stream of masked episodes.
"""

from __future__ import annotations

import json
import signal

from harmonyrl.envs.tools import Tool, ToolInfraError
from harmonyrl.sandbox.bwrap import check_sandbox
from harmonyrl.sandbox.limits import NOTHING_HIDDEN, Hidden, SandboxLimits, SandboxResult, SandboxUnavailable
from harmonyrl.sandbox.run import DEFAULT_LIMITS, run_python

_MAX_DETAIL_CHARS = 400


class SandboxError(ToolInfraError):
    """The sandbox could not run the code (not the code's fault): a masked ``sandbox_error``."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "sandbox_error")


def make_python_tool(
    limits: SandboxLimits = DEFAULT_LIMITS,
    *,
    name: str = "python",
    allow_unsafe: bool = False,
    bwrap: str | None = None,
    python: str | None = None,
    hidden: Hidden = NOTHING_HIDDEN,
    startup_slack_s: float = 5.0,
) -> Tool:
    """A tool that runs the model's Python program in the sandbox (see :func:`~harmonyrl.sandbox.run_python`).

    Raises:
        SandboxUnavailable: no working bubblewrap here and ``allow_unsafe`` is False, or ``hidden`` is not empty
            (paths absent from the code's view: only bubblewrap can hide them).
    """
    try:
        check_sandbox(bwrap, python)
    except SandboxUnavailable:
        if not allow_unsafe or hidden:
            raise

    async def run(code: str, stdin: str = "") -> str:
        result = await run_python(
            code, limits, stdin=stdin, allow_unsafe=allow_unsafe, bwrap=bwrap, python=python, hidden=hidden
        )
        if result.env_fault:
            raise SandboxError(result.stderr[:_MAX_DETAIL_CHARS])
        return format_result(result, limits)

    run.__name__ = run.__qualname__ = name
    run.__doc__ = f"""Run a Python 3 program in a sandbox and return JSON with its status, stdout and stderr.
        Each call is a fresh process: no network, only /tmp is writable, nothing is kept between calls,
        {limits.timeout_s:g} s and {limits.memory_mib} MiB at most. Print the values you want to see.

        Args:
            code: The complete program, e.g. "print(sum(i * i for i in range(10)))".
            stdin: Text the program reads from standard input.
        """
    # JSON escaping can grow the text; the sandbox's byte cap is the real limit, so the tool's must not cut JSON.
    max_chars = 6 * limits.max_output_bytes + 1024
    return Tool.from_function(run, timeout_s=limits.timeout_s + startup_slack_s, max_output_chars=max_chars)


def format_result(result: SandboxResult, limits: SandboxLimits) -> str:
    """The observation the model reads: status and output, plus a one-line ``error`` unless it went fine."""
    body: dict[str, object] = {"status": result.status, "stdout": result.stdout}
    if result.stderr:
        body["stderr"] = result.stderr
    if result.status != "ok":
        body["error"] = _explain(result, limits)
    return json.dumps(body, ensure_ascii=False)


def _explain(result: SandboxResult, limits: SandboxLimits) -> str:
    if result.status == "timeout":
        return f"timed out after {limits.timeout_s:g} s (wall clock); the program was stopped"
    if result.status == "output_limit":
        return f"output exceeded {limits.max_output_bytes} bytes; the program was stopped"
    if result.status == "killed" and result.exit_code is not None:
        sig = signal.Signals(result.exit_code - 128)
        hint = f": CPU time limit of {limits.cpu_s} s" if sig == signal.SIGXCPU else ""
        if sig == signal.SIGKILL and result.enforcement in ("cgroup2", "cgroup1"):  # the kernel's OOM kill
            hint = f" (most often: the sandbox's {limits.budget_mib} MiB memory budget for all its processes)"
        return f"killed by {sig.name}{hint}"
    return f"exit code {result.exit_code}"
