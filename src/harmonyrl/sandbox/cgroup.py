"""A cgroup per sandbox: one memory and process budget for everything a run starts, removed when it ends.

Rlimits are per process: RLIMIT_AS does not count memory-backed files (``memfd_create``, shared memory,
tmpfs pages) and 16 processes each under it add up to 16 budgets. A cgroup counts them all together, so the
kernel stops the sandbox at its budget (it kills a process of that cgroup) before the host runs short.

Where the cgroup lives: under the cgroup this process is in (the sandbox's usage also counts against any
limit a container or supervisor put on the trainer), as ``harmonyrl-<pid>-<id>``. Preferred is cgroup v2
(``memory.max``, ``memory.swap.max=0``, ``pids.max``). A v2 cgroup that has processes of its own (the
trainer's) cannot enable controllers for children, so unless it is the hierarchy's root the sandboxes go
beside it, in its parent, which already enables them (usual for root on a systemd host; for a user, start
the trainer in a leaf of a delegated cgroup, e.g. ``systemd-run --user -p Delegate=yes --scope`` and a
``trainer`` leaf holding the process). A host on the hybrid layout whose memory controller is still bound
to v1 uses v1 (``memory.limit_in_bytes``, ``memory.memsw.limit_in_bytes``, ``pids.max``). Measured in the
dev container (a VM, kernel 6.18, running as root): the v2 hierarchy offers only ``hugetlb``, the v1 memory
and pids hierarchies are writable, so v1 is used there; the v2 code is tested only on a directory shaped
like a v2 tree, not on a v2 kernel.

No cgroup is usable when the hierarchy is read-only (most containers without ``--privileged``) or a
non-root user has no delegated subtree. The caller then falls back to rlimits (see
:mod:`harmonyrl.sandbox.bwrap`) and says why, once.

The sandbox joins its cgroup itself: the launcher, the first process inside bubblewrap, writes ``0`` to an
inherited ``cgroup.procs`` descriptor before anything else runs, so every later process is born inside.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

_LOG = logging.getLogger("harmonyrl.sandbox")
PREFIX = "harmonyrl-"
_OPTIONAL = ("memory.swap.max", "memory.memsw.limit_in_bytes")  # absent without swap accounting: no swap to limit
_REMOVE_S = 5.0  # the killed sandbox's processes are gone within milliseconds; this bounds a pathological wait


@dataclass(frozen=True)
class CgroupHost:
    """Directories under which per-sandbox cgroups are created (``pids_dir`` is None without a pids controller)."""

    kind: Literal["cgroup2", "cgroup1"]
    memory_dir: str
    pids_dir: str | None

    def dirs(self) -> tuple[str, ...]:
        """The parent directories, one per hierarchy (v2: one)."""
        if self.pids_dir is None or self.pids_dir == self.memory_dir:
            return (self.memory_dir,)
        return (self.memory_dir, self.pids_dir)


def _mounts() -> list[tuple[str, str, str, set[str]]]:
    """(root, mount point, fstype, super options) of every cgroup mount, from ``/proc/self/mountinfo``."""
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            tail = fields[fields.index("-") + 1 :]
            if tail[0] in ("cgroup", "cgroup2"):
                found.append((fields[3], fields[4], tail[0], set(tail[2].split(","))))
    return found


def _own_paths() -> dict[str, str]:
    """This process's cgroup path per controller ("" is the v2 hierarchy), from ``/proc/self/cgroup``."""
    paths = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for name in controllers.split(",") if controllers else [""]:
                paths[name] = path
    return paths


def _join(root: str, mountpoint: str, path: str) -> str | None:
    if root != "/" and not (path == root or path.startswith(root + "/")):
        return None  # our cgroup is outside what this mount shows
    rel = path[len(root) :] if root != "/" else path
    return os.path.join(mountpoint, rel.lstrip("/")).rstrip("/") or "/"


def _find_v2(mounts: list[tuple[str, str, str, set[str]]], own: dict[str, str]) -> CgroupHost | str:
    v2 = [(root, point) for root, point, kind, _ in mounts if kind == "cgroup2"]
    if not v2 or "" not in own:
        return "no cgroup v2 hierarchy"
    mine = _join(*v2[0], own[""])
    if mine is None:
        return "cgroup v2: this process's cgroup is not visible"
    with open(os.path.join(mine, "cgroup.controllers")) as f:
        offered = f.read().split()
    if "memory" not in offered:
        return f"cgroup v2 at {mine} offers no memory controller (offers: {' '.join(offered) or 'none'})"
    wanted = [c for c in ("memory", "pids") if c in offered]
    refused = _enable(mine, wanted)
    if refused is None:
        return CgroupHost("cgroup2", mine, mine if "pids" in wanted else None)
    if os.path.normpath(mine) == os.path.normpath(v2[0][1]):
        return f"cgroup v2 at {mine}: cannot enable {'+'.join(wanted)} for child cgroups ({refused})"
    # A cgroup with processes of its own cannot enable controllers for children (EBUSY, the kernel's
    # no-internal-process rule); its parent already hands them to it, so the sandboxes go beside it there.
    parent = os.path.dirname(mine)
    return CgroupHost("cgroup2", parent, parent if "pids" in wanted else None)


def _enable(directory: str, controllers: Sequence[str]) -> str | None:
    """Enable ``controllers`` for the children of ``directory``; the reason it cannot, or None."""
    path = os.path.join(directory, "cgroup.subtree_control")
    try:
        with open(path) as f:
            missing = [c for c in controllers if c not in f.read().split()]
        if missing:
            with open(path, "w") as f:
                f.write(" ".join(f"+{c}" for c in missing))
    except OSError as e:
        return e.strerror or type(e).__name__
    return None


def _find_v1(mounts: list[tuple[str, str, str, set[str]]], own: dict[str, str]) -> CgroupHost | str:
    dirs: dict[str, str | None] = {}
    for controller in ("memory", "pids"):
        found = [(r, p) for r, p, kind, opts in mounts if kind == "cgroup" and controller in opts]
        dirs[controller] = _join(*found[0], own[controller]) if found and controller in own else None
    memory_dir = dirs["memory"]
    if memory_dir is None:
        return "no cgroup v1 memory hierarchy"
    return CgroupHost("cgroup1", memory_dir, dirs["pids"])


def _limit_files(host: CgroupHost, directory: str, budget: int, pids: int) -> dict[str, int]:
    """The files to write in one new cgroup directory, in order (v1's memsw limit must follow the memory one)."""
    if host.kind == "cgroup2":
        files = {"memory.max": budget, "memory.swap.max": 0}
        return {**files, "pids.max": pids} if host.pids_dir else files
    if directory == host.memory_dir:
        files = {"memory.limit_in_bytes": budget, "memory.memsw.limit_in_bytes": budget}
        return {**files, "pids.max": pids} if host.pids_dir == host.memory_dir else files
    return {"pids.max": pids}


def find_cgroup_host() -> CgroupHost | str:
    """Where per-sandbox cgroups can be made, proven by making one; else the measured reason there is none."""
    try:
        mounts, own = _mounts(), _own_paths()
        v2 = _find_v2(mounts, own)
        host = v2 if isinstance(v2, CgroupHost) else _find_v1(mounts, own)
    except (OSError, ValueError, IndexError) as e:
        return f"cannot read this process's cgroups: {e}"
    if isinstance(host, str):
        return f"{v2}; {host}"
    _remove_stale(host)
    try:
        with sandbox_cgroup(host, 64 << 20, 8):
            pass
    except OSError as e:
        return f"{host.kind} under {host.memory_dir}: cannot create a cgroup there ({e.strerror}: {e.filename})"
    return host


def _remove_stale(host: CgroupHost) -> None:
    """Remove empty cgroups left by trainers that were killed (their pid is in the name)."""
    for parent in host.dirs():
        for name in os.listdir(parent):
            pid = name[len(PREFIX) :].split("-")[0]
            if name.startswith(PREFIX) and pid.isdigit() and not _alive(int(pid)):
                with contextlib.suppress(OSError):
                    os.rmdir(os.path.join(parent, name))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def sandbox_cgroup(host: CgroupHost, budget_bytes: int, pids: int) -> Iterator[tuple[int, ...]]:
    """A fresh cgroup with the limits written; yields ``cgroup.procs`` descriptors to join it; removes it after."""
    name = f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}"
    made: list[str] = []
    fds: list[int] = []
    try:
        for parent in host.dirs():
            path = os.path.join(parent, name)
            os.mkdir(path, 0o700)
            made.append(path)
            for file, value in _limit_files(host, parent, budget_bytes, pids).items():
                _write(os.path.join(path, file), str(value), optional=file in _OPTIONAL)
            fds.append(os.open(os.path.join(path, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC))
        yield tuple(fds)
    finally:
        for fd in fds:
            os.close(fd)
        for path in made:
            _remove(path)


def _write(path: str, value: str, *, optional: bool) -> None:
    try:
        with open(path, "w") as f:
            f.write(value)
    except FileNotFoundError:
        if not optional:
            raise


def _remove(path: str) -> None:
    """Kill whatever is still in the cgroup and remove it; a cgroup that will not go is logged, never raised."""
    deadline = time.monotonic() + _REMOVE_S
    while True:
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError as e:
            if e.errno != errno.EBUSY or time.monotonic() > deadline:
                _LOG.warning("sandbox cgroup %s could not be removed: %s", path, e.strerror)
                return
        _kill_members(path)
        time.sleep(0.002)


def _kill_members(path: str) -> None:
    if os.path.exists(os.path.join(path, "cgroup.kill")):
        with contextlib.suppress(OSError):
            _write(os.path.join(path, "cgroup.kill"), "1", optional=True)
        return
    with contextlib.suppress(OSError), open(os.path.join(path, "cgroup.procs")) as f:
        for pid in f.read().split():
            with contextlib.suppress(OSError):
                os.kill(int(pid), signal.SIGKILL)
