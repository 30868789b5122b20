"""The sandbox bounds the host as a whole: memory across processes and memory-backed files, pids, files, inodes.

The bombs are bounded by construction (at most ~1.6 GiB each, the machine has 24 GiB shared with other
workers), so a sandbox whose limit failed costs the host that much for a few seconds, never more; the
assertions then fail. Host memory is measured from outside (``/proc/meminfo`` MemAvailable, sampled every
20 ms) and compared with what the bomb would have taken unchecked: other processes on the host move it too,
so the bound checked is half-way between the budget and the bomb, and the bomb's own progress (flushed line by
line) is the exact figure.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import glob
import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest
from sandbox_helpers import (
    LIMITS,
    LowestMemAvailable,
    eventually,
    fork_bomb,
    needs_bwrap,
    pids_with,
    run,
    skip_unless,
)

from harmonyrl.sandbox import SandboxLimits, SandboxUnavailable
from harmonyrl.sandbox.bwrap import cgroup_host
from harmonyrl.sandbox.cgroup import CgroupHost, _find_v2, _limit_files, find_cgroup_host
from harmonyrl.sandbox.seccomp import memfd_guard

pytestmark = needs_bwrap
HOST = cgroup_host()
needs_cgroup = skip_unless(isinstance(HOST, CgroupHost), f"no cgroup for the sandbox on this host: {HOST}")
BUDGET_MIB = 256
BOMB_MIB = 1536
BOUNDED = dataclasses.replace(
    LIMITS, timeout_s=20, cpu_s=20, memory_mib=256, max_file_mib=8, total_memory_mib=BUDGET_MIB, cgroup="require"
)
HALFWAY_MIB = (BUDGET_MIB + BOMB_MIB) // 2

MEMFD_BOMB = f"""
import os
fds, total = [], 0
while total < {BOMB_MIB << 20}:  # never mapped: RLIMIT_AS does not see a byte of it
    fd = os.memfd_create("x")
    for _ in range(8):
        os.write(fd, b"x" * (1 << 20))
    fds.append(fd)
    total += 8 << 20
    print(total >> 20, flush=True)
print("DONE", flush=True)
"""

MULTI_BOMB = """
import os, time
for i in range(8):  # 8 x 200 MiB, each process well under its own 256 MiB address-space limit
    if os.fork() == 0:
        b = bytearray(200 << 20)
        for j in range(0, len(b), 4096):
            b[j] = 1
        print("holds", i, flush=True)
        time.sleep(3)
        os._exit(0)
for _ in range(8):
    pid, status = os.wait()
    print("status", status, flush=True)
print("DONE", flush=True)
"""


def our_cgroups() -> list[str]:
    """This test process's sandbox cgroups currently on the host (none once every run has ended)."""
    if not isinstance(HOST, CgroupHost):
        return []
    return [p for d in HOST.dirs() for p in glob.glob(os.path.join(d, f"harmonyrl-{os.getpid()}-*"))]


@needs_cgroup
def test_memfd_bomb_is_stopped_at_the_sandbox_budget() -> None:
    with LowestMemAvailable() as mem:
        r = run(MEMFD_BOMB, BOUNDED)
    progress = [int(line) for line in r.stdout.split() if line.isdigit()]
    print(f"memfd bomb: {r.status}, wrote {progress[-1] if progress else 0} MiB; {mem}")
    assert r.enforcement in ("cgroup2", "cgroup1")
    assert (r.status, r.exit_code) == ("killed", 137) and "DONE" not in r.stdout
    assert progress and progress[-1] <= BUDGET_MIB  # stopped at the budget, not at 1.5 GiB
    assert mem.before - mem.lowest < HALFWAY_MIB, str(mem)


@needs_cgroup
def test_processes_each_under_their_limit_share_one_budget() -> None:
    with LowestMemAvailable() as mem:
        r = run(MULTI_BOMB, BOUNDED)
    held = r.stdout.count("holds")
    killed = sum(line == "status 9" for line in r.stdout.splitlines())  # wait status 9: SIGKILL
    print(f"multi-process bomb: {r.status}, {held} of 8 children got their 200 MiB, {killed} killed; {mem}")
    assert r.enforcement in ("cgroup2", "cgroup1") and r.status == "ok", r.stderr
    assert held <= BUDGET_MIB // 200 and killed >= 8 - BUDGET_MIB // 200
    assert mem.before - mem.lowest < HALFWAY_MIB, str(mem)


@needs_cgroup
def test_fork_bomb_is_bounded_by_the_cgroup_pids_limit() -> None:
    assert isinstance(HOST, CgroupHost)
    pids_dir = HOST.pids_dir
    assert pids_dir is not None, "the host's cgroup has no pids controller"
    seen: list[tuple[int, int]] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(0.01):
            for path in glob.glob(os.path.join(pids_dir, f"harmonyrl-{os.getpid()}-*")):
                with contextlib.suppress(OSError, ValueError):  # the run ended while we looked
                    seen.append((int(Path(path, "pids.current").read_text()), int(Path(path, "pids.max").read_text())))

    watcher = threading.Thread(target=watch)
    watcher.start()
    token = f"fork-bomb-{uuid.uuid4().hex}"
    try:
        r = run(fork_bomb(token), dataclasses.replace(LIMITS, timeout_s=2.0))
    finally:
        stop.set()
        watcher.join()
    assert r.status in ("timeout", "killed") and r.enforcement in ("cgroup2", "cgroup1")
    assert seen, "never saw the sandbox's cgroup"
    assert {limit for _, limit in seen} == {LIMITS.max_processes + 1}  # the code's budget + the sandbox's helper
    assert max(current for current, _ in seen) <= LIMITS.max_processes + 1
    assert max(current for current, _ in seen) >= LIMITS.max_processes // 2  # it did try
    assert subprocess.run(["true"]).returncode == 0
    assert eventually(lambda: not pids_with(token), 3.0) and our_cgroups() == []


def test_open_files_are_capped() -> None:
    code = """
fds = []
try:
    while len(fds) < 10_000:
        fds.append(open("/dev/null"))
except OSError as e:
    print(len(fds), e.errno)
"""
    r = run(code, dataclasses.replace(LIMITS, max_open_files=64))
    opened, err = map(int, r.stdout.split())
    assert r.status == "ok" and err == errno.EMFILE
    assert 64 - 16 < opened < 64  # the interpreter holds a few of the 64 itself


def test_tmp_inode_bomb_is_capped() -> None:
    code = """
import os
n = 0
try:
    while n < 20_000:  # empty files: no bytes against tmp_mib, ~1 KiB of kernel memory each
        os.close(os.open(f"/tmp/f{n}", os.O_CREAT | os.O_WRONLY))
        n += 1
    print(n, "no limit")
except OSError as e:
    print(n, e.strerror)
"""
    r = run(code, dataclasses.replace(LIMITS, tmp_inodes=500))
    count, reason = r.stdout.split(maxsplit=1)
    assert r.status == "ok" and reason.strip() == "No space left on device"
    assert 500 - 10 < int(count) < 500  # main.py and the root directory take their share


def test_without_a_cgroup_memory_backed_files_are_refused() -> None:
    code = """
import ctypes, os
try:
    os.memfd_create("x")
    print("MEMFD")
except OSError as e:
    print("memfd", e.errno)
libc = ctypes.CDLL(None, use_errno=True)
print("shmget", libc.shmget(0, 1 << 20, 0o1000 | 0o600), ctypes.get_errno())
print("x32", libc.syscall(0x40000000 + 319, b"x", 0), ctypes.get_errno())  # memfd_create through the x32 ABI
print("other", len(os.listdir("/tmp")) > 0)  # everything else still works
"""
    r = run(code, dataclasses.replace(LIMITS, cgroup="off"))
    assert r.enforcement == "rlimits" and r.status == "ok", r.stderr
    if memfd_guard() is None:
        pytest.skip(f"no seccomp program for {os.uname().machine}: the fallback cannot refuse memfd here")
    lines = r.stdout.splitlines()
    assert lines[0] == f"memfd {errno.EPERM}" and lines[1] == f"shmget -1 {errno.EPERM}"
    if os.uname().machine == "x86_64":
        assert lines[2] == f"x32 -1 {errno.EPERM}"
    assert lines[3] == "other True"


def test_cgroup_policy_is_reported_and_required_when_asked() -> None:
    r = run("print(1)")
    expected = HOST.kind if isinstance(HOST, CgroupHost) else "rlimits"
    assert (r.status, r.enforcement) == ("ok", expected)
    if isinstance(HOST, CgroupHost):
        assert run("print(1)", dataclasses.replace(LIMITS, cgroup="require")).enforcement == HOST.kind
    else:
        with pytest.raises(SandboxUnavailable, match="cgroup='require'"):
            run("print(1)", dataclasses.replace(LIMITS, cgroup="require"))


@needs_cgroup
def test_no_cgroup_is_left_behind() -> None:
    assert isinstance(HOST, CgroupHost)
    stale = os.path.join(HOST.memory_dir, "harmonyrl-999999999-stale")  # pid_max is at most 2^22: a dead trainer
    os.mkdir(stale)
    assert find_cgroup_host() == HOST and not os.path.exists(stale)  # swept when a trainer starts
    during: list[str] = []
    code = "import time\nprint('up', flush=True)\ntime.sleep(30)"
    done = threading.Thread(target=lambda: run(code, dataclasses.replace(LIMITS, timeout_s=1.0)))
    done.start()
    assert eventually(lambda: bool(during.extend(our_cgroups()) or during), 5.0)
    done.join()
    run("import os\nos.kill(os.getpid(), 9)")
    run(MULTI_BOMB, dataclasses.replace(BOUNDED, timeout_s=1.0))
    assert our_cgroups() == [], our_cgroups()


def test_cgroup_v2_parent_enables_its_controllers_and_limits_are_written(tmp_path: Path) -> None:
    # A cgroup v2 tree cannot be made on a v1 host; the decisions are checked on a directory shaped like one.
    (tmp_path / "trainer").mkdir()
    (tmp_path / "trainer" / "cgroup.controllers").write_text("cpu io memory pids\n")
    (tmp_path / "trainer" / "cgroup.subtree_control").write_text("cpu\n")
    host = _find_v2([("/", str(tmp_path), "cgroup2", {"rw"})], {"": "/trainer"})
    assert host == CgroupHost("cgroup2", str(tmp_path / "trainer"), str(tmp_path / "trainer"))
    assert (tmp_path / "trainer" / "cgroup.subtree_control").read_text() == "+memory +pids"
    assert _limit_files(host, host.memory_dir, 256 << 20, 17) == {
        "memory.max": 256 << 20,
        "memory.swap.max": 0,
        "pids.max": 17,
    }
    # the trainer's cgroup holds the trainer, so it cannot enable controllers (EBUSY; here: a directory
    # where the file should be): its parent, which enables them for it, holds the sandboxes
    (tmp_path / "svc" / "trainer" / "cgroup.subtree_control").mkdir(parents=True)
    (tmp_path / "svc" / "trainer" / "cgroup.controllers").write_text("memory pids\n")
    beside = _find_v2([("/", str(tmp_path), "cgroup2", set())], {"": "/svc/trainer"})
    assert beside == CgroupHost("cgroup2", str(tmp_path / "svc"), str(tmp_path / "svc"))
    (tmp_path / "cgroup.subtree_control").mkdir()
    (tmp_path / "cgroup.controllers").write_text("memory pids\n")
    at_root = _find_v2([("/", str(tmp_path), "cgroup2", set())], {"": "/"})
    assert "cannot enable memory+pids for child cgroups" in str(at_root)  # no parent to fall back to
    (tmp_path / "trainer" / "cgroup.controllers").write_text("cpu io\n")
    assert "offers no memory controller" in str(_find_v2([("/", str(tmp_path), "cgroup2", set())], {"": "/trainer"}))
    v1 = CgroupHost("cgroup1", "/m", "/p")
    assert _limit_files(v1, "/m", 1 << 28, 5) == {
        "memory.limit_in_bytes": 1 << 28,
        "memory.memsw.limit_in_bytes": 1 << 28,
    }
    assert _limit_files(v1, "/p", 1 << 28, 5) == {"pids.max": 5}


def test_limits_validate_the_new_fields() -> None:
    assert SandboxLimits().budget_mib == 512 + 64 and SandboxLimits(total_memory_mib=100).budget_mib == 100
    assert SandboxLimits().rlimits()["RLIMIT_NOFILE"] == (256, 256)
    with pytest.raises(ValueError, match="max_open_files must be at least"):
        SandboxLimits(max_open_files=4)
    with pytest.raises(ValueError, match="tmp_inodes must be positive"):
        SandboxLimits(tmp_inodes=0)
    with pytest.raises(ValueError, match="cgroup must be"):
        SandboxLimits(cgroup="maybe")  # type: ignore[arg-type]
    assert memfd_guard("riscv64") is None and len(memfd_guard("x86_64") or b"") % 8 == 0
    assert sys.platform == "linux"
