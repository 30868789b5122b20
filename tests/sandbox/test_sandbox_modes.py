"""Around the battery: the python tool and its failure semantics, missing bubblewrap, the unsafe opt-in,
and the non-root (user namespace) mode, exercised here by running the sandbox as an unprivileged user."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandbox_helpers import BWRAP_CAUSE, IN_CI, LIMITS, needs_bwrap, run, skip_unless

import harmonyrl
from harmonyrl.envs.python_tool import format_result, make_python_tool
from harmonyrl.envs.tools import Toolbox
from harmonyrl.sandbox import (
    SandboxLimits,
    SandboxResult,
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


def _unprivileged() -> tuple[str | None, dict[str, object]]:
    """An interpreter and ``subprocess.run`` arguments that run a script without root (the non-root mode).

    As root (containers, CI) the script runs as ``nobody`` with a system Python (the dev container's own is
    under /root, unreadable to it); as a user, as that user with this interpreter.
    """
    if os.geteuid() != 0:
        return sys.executable, {}
    python = next((p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if os.access(p, os.X_OK)), None)
    return python, {"user": 65534, "group": 65534, "extra_groups": []}


NON_ROOT_SCRIPT = """
import asyncio, json, sys
from harmonyrl.sandbox import SandboxLimits, SandboxUnavailable, run_python
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
    "environ": "import os\\nfor p in ('/proc/1/environ', '/proc/self/environ', f'/proc/{os.getppid()}/environ'):\\n"
               "    try:\\n        print(p, open(p, 'rb').read())\\n"
               "    except OSError as e:\\n        print(p, e.strerror)\\n"
               "print('os.environ', dict(os.environ))\\nprint('pid1', open('/proc/1/cmdline', 'rb').read()[:40])",
    "caps": "print([l.split()[1] for l in open('/proc/self/status') if l.startswith('Cap')])",
    "tmp": "print([l.split()[-1] for l in open('/proc/self/mountinfo') if ' /tmp ' in l][-1])",
    "memfd": "import os\\ntry:\\n    os.memfd_create('x')\\n    print('allowed')\\nexcept OSError as e:\\n"
             "    print(e.strerror)",
}
async def main():
    results = await asyncio.gather(*(run_python(c, limits, python=sys.executable) for c in snippets.values()))
    out = {k: [r.status, r.stdout.strip()] for k, r in zip(snippets, results)}
    out["enforcement"] = sorted({r.enforcement for r in results})
    try:
        await run_python("print(1)", SandboxLimits(cgroup="require"), python=sys.executable)
        out["require"] = "ran"
    except SandboxUnavailable as e:
        out["require"] = str(e)
    print(json.dumps(out))
asyncio.run(main())
"""
SECRET = "hunter2-" + uuid.uuid4().hex


@pytest.fixture
def world_readable_sandbox() -> Iterator[str]:
    """A copy of the sandbox package that ``nobody`` can read, wherever the checkout lives (a clone under a 0700
    home is unreadable to it). The package is a leaf, standard library only, so it runs on its own; its parent
    package is an empty stub, which keeps the test independent of what ``harmonyrl/__init__`` imports."""
    root = Path(tempfile.mkdtemp(prefix="harmonyrl-nonroot-", dir="/tmp"))
    try:
        shutil.copytree(Path(harmonyrl.__file__).parent / "sandbox", root / "harmonyrl" / "sandbox",
                        ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
        (root / "harmonyrl" / "__init__.py").write_text("")
        for path in (root, *root.rglob("*")):
            path.chmod(0o755 if path.is_dir() else 0o644)
        yield str(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@needs_bwrap
@skip_unless(_unprivileged()[0] is not None, "no system python3 an unprivileged user could run")
def test_non_root_mode_isolates_too_and_hides_the_host_environment(world_readable_sandbox: str) -> None:
    src = world_readable_sandbox
    python, user = _unprivileged()
    assert python is not None and shutil.which("bwrap") is not None
    # the trainer's environment holds a secret (an API key): bubblewrap, pid 1 of a non-root sandbox, must not
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": src, "PYTHONDONTWRITEBYTECODE": "1", "HARMONYRL_KEY": SECRET}
    done = subprocess.run(
        [python, "-c", NON_ROOT_SCRIPT], cwd="/", env=env, capture_output=True, text=True, timeout=60, **user
    )  # type: ignore[call-overload]
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["hello"][0] == "ok" and seen["hello"][1] == f"uid {os.geteuid() if not user else 65534}"
    assert seen["forks"][0] == "ok" and 1 <= int(seen["forks"][1]) < 8  # RLIMIT_NPROC holds in a user namespace
    assert seen["net"] == ["ok", "OSError"]  # network unreachable
    assert seen["userns"] == ["ok", "1"]  # --disable-userns
    assert seen["write"] == ["ok", "\n".join(["Read-only file system"] * 5)]  # only /tmp is writable
    status, environ = seen["environ"]
    assert status == "ok" and environ.count("environ") == 4 and "bwrap" in environ  # pid 1 is bubblewrap
    assert SECRET not in environ and "HARMONYRL_KEY" not in environ  # not via /proc/1, self, ppid, os.environ
    assert set(seen["caps"][1].strip("[]").replace("'", "").split(", ")[:3]) == {"0000000000000000"}  # inh/prm/eff
    assert seen["tmp"][0] == "ok" and "nr_inodes=4096" in seen["tmp"][1]  # the inode cap holds without root too
    if seen["enforcement"] == ["rlimits"]:  # no delegated cgroup for this user: the fallback's guard holds
        assert seen["memfd"] == ["ok", "Operation not permitted"]
        assert "(cgroup='require') but no cgroup is usable here" in seen["require"]
    else:
        assert seen["require"] == "ran"


@needs_bwrap
def test_an_interpreter_in_a_venv_under_tmp_runs(tmp_path: Path) -> None:
    # The private /tmp would hide it: its prefix is bound read-only over the tmpfs at its own path.
    venv = tmp_path / "venv"
    assert str(venv).startswith("/tmp/"), "pytest's tmp_path is expected under /tmp"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = next(venv.glob("lib/python3*/site-packages"))
    (site / "harmonyrl_venv_probe.py").write_text("WHERE = 'venv site-packages'\n")
    code = f"""
import sys, harmonyrl_venv_probe
print(sys.prefix, harmonyrl_venv_probe.WHERE)
try:
    open("{site}/planted.py", "w")
    print("WROTE")
except OSError as e:
    print(e.strerror)
open("/tmp/scratch", "w").write("tmp is still writable")
print(open("/tmp/scratch").read())
"""
    r = run(code, python=str(venv / "bin" / "python"))
    assert (r.status, r.isolated) == ("ok", True), r.stderr
    assert r.stdout.splitlines() == [
        f"{venv} venv site-packages",
        "Read-only file system",
        "tmp is still writable",
    ]
    assert not (site / "planted.py").exists()


def test_ci_never_passes_the_battery_by_skipping_it() -> None:
    # Under CI=true (.ci/run sets it) a machine that cannot sandbox fails here and in every battery test.
    assert not (IN_CI and BWRAP_CAUSE is not None), f"CI has no working sandbox: {BWRAP_CAUSE}"


def test_python_tool_names_the_memory_budget_when_the_kernel_kills() -> None:
    limits = SandboxLimits(memory_mib=64, tmp_mib=16)
    oom = SandboxResult("killed", 137, "", "", 0.1, False, True, "cgroup1")
    assert json.loads(format_result(oom, limits))["error"] == (
        "killed by SIGKILL (most often: the sandbox's 80 MiB memory budget for all its processes)"
    )
    no_cgroup = dataclasses.replace(oom, enforcement="rlimits")
    assert json.loads(format_result(no_cgroup, limits))["error"] == "killed by SIGKILL"
