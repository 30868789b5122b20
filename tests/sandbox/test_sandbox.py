"""The hostile battery: every snippet must be contained and leave the host (this test process) unaffected.

Each test runs real code under real bubblewrap; nothing here is mocked. Limits are tight (see
``sandbox_helpers.LIMITS``) so the whole file stays well under a minute even on a loaded machine.
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import os
import signal
import socket
import subprocess
import uuid
from pathlib import Path

import pytest
from sandbox_helpers import LIMITS, SLACK_S, eventually, fork_bomb, needs_bwrap, pids_with, run

import harmonyrl
from harmonyrl.sandbox import SandboxResult, run_python

pytestmark = needs_bwrap
REPO = Path(harmonyrl.__file__).resolve().parents[2]


def test_normal_code_returns_stdout() -> None:
    r = run("import sys\nprint('hello', sum(range(10)))\nprint(sys.version_info[0], file=sys.stderr)")
    assert (r.status, r.exit_code, r.stdout, r.stderr.strip()) == ("ok", 0, "hello 45\n", "3")
    assert r.isolated and not r.truncated and not r.env_fault and 0 < r.duration_s < LIMITS.timeout_s


def test_exception_is_an_error_with_traceback() -> None:
    r = run("x = 1\nraise ValueError('bad ' + str(x))")
    assert (r.status, r.exit_code) == ("error", 1)
    assert 'File "/tmp/main.py", line 2' in r.stderr and "ValueError: bad 1" in r.stderr
    assert not r.env_fault  # the model's fault: an observation, never masked


def test_stdin_is_passed_even_when_large() -> None:
    big = "ab\n" * 100_000  # larger than a pipe buffer: feeding and reading must not deadlock
    r = run("import sys\ndata = sys.stdin.read()\nprint(len(data), data[:2][::-1])", stdin=big)
    assert (r.status, r.stdout) == ("ok", f"{len(big)} ba\n")


def test_invalid_utf8_output_is_replaced() -> None:
    r = run("import sys\nsys.stdout.buffer.write(b'ok \\xff\\xfe end')")
    assert r.status == "ok" and r.stdout == "ok \ufffd\ufffd end"


def test_host_files_are_not_visible(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    monkeypatch.setenv("HARMONYRL_TEST_SECRET", "host-env-secret")
    targets = ["/etc/shadow", "/etc/passwd", "/root/.bash_history", str(REPO / "pyproject.toml"), str(secret)]
    code = f"""
import os
for path in {targets!r}:
    try:
        open(path).read()
        print("READ", path)
    except OSError as e:
        print("denied", path, type(e).__name__)
print("root:", sorted(os.listdir("/root")) if os.path.isdir("/root") else [])
print("pids:", sum(p.isdigit() for p in os.listdir("/proc")))
print("env:", sorted(os.environ))
"""
    r = run(code)
    assert r.status == "ok", r.stderr
    assert "READ" not in r.stdout and r.stdout.count("denied") == len(targets)
    root_line = next(line for line in r.stdout.splitlines() if line.startswith("root:"))
    assert set(ast.literal_eval(root_line[5:])) <= {
        ".pyenv"
    }  # at most the way to the Python install, nothing else of /root
    assert int(r.stdout.split("pids:")[1].split()[0]) < 10  # a private pid namespace: not the host's processes
    assert "HARMONYRL_TEST_SECRET" not in r.stdout and "host secret" not in r.stdout


def test_writes_outside_tmp_fail_and_nothing_reaches_the_host(tmp_path: Path) -> None:
    marker = f"escape-{uuid.uuid4().hex}"
    targets = [f"/{marker}", f"/usr/{marker}", f"/etc/{marker}", f"/root/{marker}", f"/dev/{marker}"]
    targets.append(f"/dev/shm/{marker}")
    targets.append(str(tmp_path / marker))
    code = f"""
for path in {targets!r}:
    try:
        open(path, "w").write("x")
        print("WROTE", path)
    except OSError as e:
        print("denied", path, type(e).__name__)
open("/dev/null", "w").write("devices still work")
open("/tmp/{marker}", "w").write("private")
print(open("/tmp/{marker}").read())
"""
    r = run(code)
    assert r.status == "ok", r.stderr
    assert "WROTE" not in r.stdout and r.stdout.count("denied") == len(targets) and "private" in r.stdout
    for path in [*targets, f"/tmp/{marker}"]:  # the sandbox's /tmp is private too
        assert not os.path.exists(path), path


def test_file_size_and_tmp_are_capped() -> None:
    code = """
try:
    open("/tmp/big", "wb").write(b"x" * (2 << 20))
except OSError as e:
    print("fsize", e.strerror)
n = 0
try:
    for n in range(100):
        open(f"/tmp/f{n}", "wb").write(b"x" * ((1 << 20) - 4096))  # each file under the size limit
except OSError as e:
    print("tmp full after", n, e.strerror)
"""
    r = run(code)
    assert "fsize File too large" in r.stdout  # max_file_mib=1
    assert "tmp full after" in r.stdout and "No space left on device" in r.stdout  # tmp_mib=8
    assert int(r.stdout.split("after")[1].split()[0]) <= LIMITS.tmp_mib


def test_network_is_unreachable_including_host_localhost() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    abstract = f"\0harmonyrl-test-{uuid.uuid4().hex}"
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(abstract)
    unix.listen()
    code = f"""
import socket
for family, addr in [(socket.AF_INET, ("1.1.1.1", 53)), (socket.AF_INET, ("127.0.0.1", {port})),
                     (socket.AF_UNIX, {abstract!r})]:
    s = socket.socket(family)
    s.settimeout(2)
    try:
        s.connect(addr)
        print("CONNECTED", addr)
    except OSError as e:
        print("blocked", type(e).__name__)
try:
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("1.1.1.1", 53))
    print("SENT")
except OSError as e:
    print("blocked", type(e).__name__)
print([name for _, name in socket.if_nameindex()])
"""
    try:
        r = run(code)
        for server in (listener, unix):
            server.setblocking(False)
            with pytest.raises(BlockingIOError):
                server.accept()  # nobody from the sandbox ever reached the host's listeners
    finally:
        listener.close()
        unix.close()
    assert r.status == "ok", r.stderr
    assert "CONNECTED" not in r.stdout and "SENT" not in r.stdout and r.stdout.count("blocked") == 4
    assert r.stdout.splitlines()[-1] == "['lo']"


def test_privilege_and_namespace_escapes_fail() -> None:
    code = """
import os, subprocess
print("uid", os.getuid())
for attempt in (lambda: os.setuid(0), lambda: os.chroot("/")):
    try:
        attempt()
        print("ESCALATED")
    except OSError as e:
        print("denied", type(e).__name__)
r = subprocess.run(["unshare", "-Ur", "true"], capture_output=True)
print("unshare", r.returncode)
"""
    r = run(code)
    assert r.status == "ok", r.stderr
    assert "ESCALATED" not in r.stdout and r.stdout.count("denied") == 2
    assert "unshare 0" not in r.stdout  # no nested user namespaces (no mounts, no unbounded tmpfs)


def test_fork_bomb_is_bounded_and_leaves_nothing() -> None:
    token = f"fork-bomb-{uuid.uuid4().hex}"
    limits = dataclasses.replace(LIMITS, timeout_s=2.0)
    r = run(fork_bomb(token), limits)
    assert r.status in ("timeout", "killed") and r.duration_s < limits.timeout_s + SLACK_S
    assert subprocess.run(["true"]).returncode == 0  # the host can still start processes
    assert eventually(lambda: not pids_with(token), 3.0)


def test_process_limit_is_enforced() -> None:
    code = """
import os, time
n = 0
try:
    while n < 100:
        if os.fork() == 0:
            time.sleep(5)
            os._exit(0)
        n += 1
except OSError as e:
    print(n, type(e).__name__)
"""
    r = run(code)
    count, error = r.stdout.split()
    assert error == "BlockingIOError" and 1 <= int(count) < LIMITS.max_processes


def test_process_budgets_are_per_sandbox() -> None:
    hog = """
import os, time
try:
    while True:
        if os.fork() == 0:
            time.sleep(3)
            os._exit(0)
except OSError:
    print("hog full", flush=True)
time.sleep(3)
"""
    worker = """
import os, time
time.sleep(1)  # by now the hog has used up its whole budget
for _ in range(8):
    if os.fork() == 0:
        time.sleep(0.5)
        os._exit(0)
print("ok")
"""

    async def both() -> tuple[SandboxResult, SandboxResult]:
        return await asyncio.gather(run_python(hog, LIMITS), run_python(worker, LIMITS))

    hog_result, worker_result = asyncio.run(both())
    assert "hog full" in hog_result.stdout
    assert worker_result.status == "ok", worker_result.stderr  # untouched by the other sandbox's fork bomb


@pytest.mark.parametrize(
    "code", ["b = bytearray(4 << 30)", "chunks = []\nwhile True:\n    chunks.append(bytearray(16 << 20))"]
)
def test_memory_bomb_is_contained(code: str) -> None:
    r = run(code)
    assert r.status in ("error", "killed") and r.duration_s < LIMITS.timeout_s
    assert r.status == "killed" or "MemoryError" in r.stderr


def test_infinite_loop_times_out() -> None:
    limits = dataclasses.replace(LIMITS, timeout_s=1.0, cpu_s=60)
    r = run("while True:\n    pass", limits)
    assert (r.status, r.exit_code) == ("timeout", None)
    assert limits.timeout_s <= r.duration_s < limits.timeout_s + SLACK_S


def test_cpu_limit_kills() -> None:
    r = run("while True:\n    pass", dataclasses.replace(LIMITS, cpu_s=1, timeout_s=10))
    assert (r.status, r.exit_code) == ("killed", 128 + signal.SIGXCPU)


@pytest.mark.parametrize(
    "code",
    [
        "while True:\n    print('x' * 1000)",
        "import sys\nsys.stdout.write('y' * 10**8)",
        "import sys\nwhile True:\n    sys.stderr.write('e' * 4096)",
    ],
)
def test_huge_output_is_truncated(code: str) -> None:
    r = run(code)
    assert (r.status, r.truncated) == ("output_limit", True)
    kept = len(r.stdout.encode()) + len(r.stderr.encode())
    assert LIMITS.max_output_bytes <= kept < LIMITS.max_output_bytes + 200 and "truncated" in r.stdout + r.stderr
    assert r.duration_s < LIMITS.timeout_s  # stopped at the limit, not at the timeout


@pytest.mark.parametrize("code", ["os.kill(os.getppid(), 9)", "os.killpg(0, 9)", "os.kill(-1, 9)", "os.kill(1, 9)"])
def test_killing_the_parent_stays_inside(code: str) -> None:
    canary = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        r = run(f"import os, time\nprint('start', flush=True)\n{code}\ntime.sleep(1)\nprint('after')")
        assert canary.poll() is None  # host processes (and this test) are untouched
    finally:
        canary.kill()
        canary.wait()
    # It may take itself down (killed) or be refused (error); either way it ends, and it is the model's doing.
    assert r.stdout == "start\n" and r.status in ("killed", "error") and not r.env_fault


def test_cancellation_kills_the_sandbox_and_its_detached_children() -> None:
    token = f"{os.getpid()}.{uuid.uuid4().int % 10**6:06d}"  # `sleep 1234.567890`: findable on the host
    code = f"""
import os
if os.fork() == 0:
    os.setsid()  # a grandchild in its own session: killing a process group would miss it
    os.execv("/usr/bin/sleep", ["sleep", "{token}1"])
os.execv("/usr/bin/sleep", ["sleep", "{token}2"])
"""

    async def start_then_cancel() -> None:
        task = asyncio.create_task(run_python(code, dataclasses.replace(LIMITS, timeout_s=60)))
        appeared = await asyncio.to_thread(eventually, lambda: len(pids_with(token)) == 2)
        assert appeared, "the sandboxed sleeps never started"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(start_then_cancel())
    assert eventually(lambda: not pids_with(token), 3.0), f"survivors: {pids_with(token)}"
