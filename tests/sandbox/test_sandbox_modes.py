"""Around the battery: the python tool and its failure semantics, missing bubblewrap, the unsafe opt-in,
and the non-root (user namespace) mode, exercised here by running the sandbox as an unprivileged user."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import subprocess
import uuid
import warnings
from pathlib import Path

import pytest
from sandbox_helpers import LIMITS, needs_bwrap, run

import harmonyrl
from harmonyrl.envs.python_tool import make_python_tool
from harmonyrl.envs.tools import Toolbox
from harmonyrl.sandbox import (
    SandboxLimits,
    SandboxUnavailable,
    UnsafeExecutionWarning,
    check_sandbox,
)
from harmonyrl.types import Message

MISSING = "/nonexistent/harmonyrl-test/bwrap"


def tool_call(code: str) -> Message:
    args = json.dumps({"code": code})
    return Message(role="assistant", content=args, channel="commentary", recipient="functions.python")


def test_limits_are_validated() -> None:
    with pytest.raises(ValueError, match="timeout_s must be positive"):
        SandboxLimits(timeout_s=0)
    with pytest.raises(ValueError, match="memory_mib must be at least 32"):
        SandboxLimits(memory_mib=8)  # Python could not even start: that must not look like the code's error
    assert SandboxLimits().rlimits()["RLIMIT_CORE"] == (0, 0)


def test_missing_bwrap_refuses_with_a_clear_message() -> None:
    expected = r"bubblewrap not found .*apt-get install bubblewrap.*allow_unsafe=True"
    with pytest.raises(SandboxUnavailable, match=expected):
        run("print(1)", bwrap=MISSING)
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
        make_python_tool(bwrap=MISSING)  # at set-up time, not as a stream of masked episodes
    with pytest.raises(SandboxUnavailable, match="not found"):
        check_sandbox(bwrap=MISSING)


def test_allow_unsafe_runs_without_isolation_and_warns_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARMONYRL_TEST_SECRET", "host-env-secret")
    missing = f"{MISSING}-{uuid.uuid4().hex}"  # a path of its own, so this test sees the one warning
    limits = dataclasses.replace(LIMITS, timeout_s=1.0)
    code = "import os, sys\nprint(sys.stdin.read(), sorted(os.environ), os.listdir('.'))"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ok = run(code, limits, stdin="in", allow_unsafe=True, bwrap=missing)
        error = run("1/0", limits, allow_unsafe=True, bwrap=missing)
        slow = run("import time\ntime.sleep(30)", limits, allow_unsafe=True, bwrap=missing)
    unsafe = [w for w in caught if issubclass(w.category, UnsafeExecutionWarning)]
    assert len(unsafe) == 1 and "WITHOUT isolation" in str(unsafe[0].message)
    assert (ok.status, ok.isolated) == ("ok", False)
    assert ok.stdout.startswith("in ") and "HARMONYRL_TEST_SECRET" not in ok.stdout and "['main.py']" in ok.stdout
    assert error.status == "error" and "ZeroDivisionError" in error.stderr
    assert slow.status == "timeout" and slow.duration_s < 3


@pytest.mark.filterwarnings("ignore::harmonyrl.sandbox.UnsafeExecutionWarning")
def test_a_sandbox_that_cannot_start_is_an_environment_fault() -> None:
    # The unsafe path with an interpreter that does not exist: nothing of the model's ever ran.
    r = run("print(1)", allow_unsafe=True, bwrap=MISSING, python="/nonexistent/python3")
    assert r.status == "sandbox_failure" and r.env_fault and "/nonexistent/python3" in r.stderr

    broken = make_python_tool(allow_unsafe=True, bwrap=MISSING, python="/nonexistent/python3")
    dispatch = asyncio.run(Toolbox([broken]).dispatch(tool_call("print(1)")))
    assert dispatch.observation is None and dispatch.failure is not None
    assert dispatch.failure.kind == "sandbox_error"  # masked by the loop, never scored as a wrong answer


@needs_bwrap
def test_python_tool_declares_and_returns_observations() -> None:
    tool = make_python_tool(dataclasses.replace(LIMITS, timeout_s=1.0))
    assert tool.name == "python" and tool.spec.parameters["required"] == ["code"]
    assert "1 s" in tool.description and "no network" in tool.description
    toolbox = Toolbox([tool])

    def observe(code: str) -> dict[str, object]:
        dispatch = asyncio.run(toolbox.dispatch(tool_call(code)))
        assert dispatch.failure is None and dispatch.observation is not None
        return json.loads(dispatch.observation.content)

    assert observe("print(6 * 7)") == {"status": "ok", "stdout": "42\n"}
    crashed = observe("1/0")  # the model's own error: an observation it can learn from
    assert crashed["status"] == "error" and "ZeroDivisionError" in str(crashed["stderr"])
    assert crashed["error"] == "exit code 1"
    looped = observe("while True:\n    pass")
    assert looped["status"] == "timeout" and "timed out after 1 s" in str(looped["error"])
    spam = observe("while True:\n    print('z' * 100)")
    assert spam["status"] == "output_limit" and str(spam["stdout"]).endswith("the program was stopped]")


def _system_python() -> str | None:
    """A Python outside /root that an unprivileged user can run (the dev container's own is under /root)."""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.access(candidate, os.X_OK):
            return candidate
    return None


NON_ROOT_SCRIPT = """
import asyncio, json, sys
from harmonyrl.sandbox import SandboxLimits, run_python
limits = SandboxLimits(timeout_s=5, max_processes=8, tmp_mib=4)
snippets = {
    "hello": "import os; print('uid', os.getuid())",
    "forks": "import os, time\\nn = 0\\ntry:\\n    while n < 50:\\n        if os.fork() == 0:\\n"
             "            time.sleep(3); os._exit(0)\\n        n += 1\\nexcept OSError:\\n    print(n)",
    "net": "import socket\\ntry:\\n    socket.create_connection(('1.1.1.1', 53), 2)\\nexcept OSError as e:\\n"
           "    print(type(e).__name__)",
    "userns": "import subprocess; print(subprocess.run(['unshare', '-Ur', 'true']).returncode)",
    "write": "for p in ('/x', '/usr/x', '/etc/x', '/dev/x', '/dev/shm/x'):\\n    try:\\n        open(p, 'w')\\n"
             "    except OSError as e:\\n        print(e.strerror)\\nopen('/dev/null', 'w').write('ok')",
}
async def main():
    results = await asyncio.gather(*(run_python(c, limits, python=sys.executable) for c in snippets.values()))
    print(json.dumps({k: [r.status, r.stdout.strip()] for k, r in zip(snippets, results)}))
asyncio.run(main())
"""


@needs_bwrap
@pytest.mark.skipif(os.geteuid() != 0, reason="running as non-root, every other test already uses the non-root mode")
@pytest.mark.skipif(_system_python() is None, reason="no system python3 an unprivileged user could run")
def test_non_root_mode_isolates_too() -> None:
    src = str(Path(harmonyrl.__file__).resolve().parents[1])
    python = _system_python()
    assert python is not None and shutil.which("bwrap") is not None
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": src, "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run(
        [python, "-c", NON_ROOT_SCRIPT], user=65534, group=65534, extra_groups=[], cwd="/", env=env,
        capture_output=True, text=True, timeout=45,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["hello"] == ["ok", "uid 65534"]
    assert seen["forks"][0] == "ok" and 1 <= int(seen["forks"][1]) < 8  # RLIMIT_NPROC holds in a user namespace
    assert seen["net"] == ["ok", "OSError"]  # network unreachable
    assert seen["userns"] == ["ok", "1"]  # --disable-userns
    assert seen["write"] == ["ok", "\n".join(["Read-only file system"] * 5)]  # only /tmp is writable
