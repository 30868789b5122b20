"""How model code is isolated: the bubblewrap command line, and the one-time check that it works on this machine.

Every run is ``bwrap … python -I -S -c LAUNCHER …``: bubblewrap builds an empty root with read-only ``/usr``,
``/lib*``, a few ``/etc`` files and the Python install, a fresh ``/proc``, a minimal ``/dev``, and a
size-capped private tmpfs ``/tmp`` (the only writable place, also the cwd) holding the code as
``/tmp/main.py``; an empty environment; new network, pid, ipc and uts namespaces (no network at all: a
loopback with nothing behind it). The launcher (:mod:`harmonyrl.sandbox.launcher`) joins the run's cgroup,
caps ``/tmp``'s inodes, applies the rlimits, reports "started" on a pipe (so a sandbox that never came up is
told apart from code that crashed) and execs ``python -I -u /tmp/main.py``.

Measured in the dev container (bubblewrap 0.8.0, Debian 12, kernel 6.x, running as root, user namespaces
allowed), and the reason for each less obvious flag:

* **non-root** (a developer machine): ``--unshare-all --unshare-user --disable-userns``. RLIMIT_NPROC, set
  inside the sandbox's own user namespace, is counted per sandbox by the kernel. ``--cap-add CAP_SYS_ADMIN``
  holds only inside the sandbox's user namespace, for the launcher's ``/tmp`` mount; the launcher drops it.
* **root** (containers, CI): plain ``--unshare-all`` runs the code as host uid 0 inside a user namespace,
  and the kernel never applies RLIMIT_NPROC to uid 0: 10 of 10 forks succeeded under a limit of 5, an
  unbounded fork bomb. So bubblewrap runs privileged *without* a user namespace and drops every capability
  but SETUID/SETGID (and SYS_ADMIN for the launcher's mount); the launcher switches to a host uid of its own
  (one per concurrent sandbox, see :class:`_UidPool`), which clears them all, and execs a nested unprivileged
  ``bwrap --unshare-user --disable-userns``, because otherwise the code could ``unshare -Ur`` (measured: it
  could) and mount, e.g., an unbounded tmpfs. The nested one uses ``--dev-bind``: a plain ``--bind`` is
  nodev and made ``/dev/null`` unwritable.
* bubblewrap itself starts with a minimal environment (``PATH``, ``LANG``, ``HOME=/tmp``): without root it is
  pid 1 of the sandbox, and the code read the trainer's whole environment (API keys) from ``/proc/1/environ``.
* bubblewrap creates missing parents of a bind as 0700: the Python install under ``/root/.pyenv`` was
  unreachable for the dropped uid until the parents were made 0755 (``--perms 0755 --dir``). An install
  under ``/tmp`` (a venv there) is bound after the private ``/tmp`` is mounted, on top of it.
* bubblewrap's own root and ``/dev`` are tmpfs without a size limit, and in the non-root mode they belong
  to the code's uid: ``/``, ``/etc`` and ``/dev/shm`` were writable, so both are remounted read-only.

**The whole sandbox's budget.** Rlimits are per process. Where the host offers a cgroup
(:mod:`harmonyrl.sandbox.cgroup`), each run gets one: memory (every process, ``/tmp``, memfd and shared
memory together, no swap) and pids. Where it does not (a read-only ``/sys/fs/cgroup``, a non-root user
without delegation), the fallback is: RLIMIT_AS, RLIMIT_NPROC, RLIMIT_NOFILE, RLIMIT_FSIZE per process;
``/tmp`` capped in bytes and inodes; no writable ``/dev/shm``; and a seccomp filter refusing
``memfd_create`` and SysV ``shmget`` (:mod:`harmonyrl.sandbox.seccomp`). What the fallback does not bound,
and why the cgroup is preferred: memory across processes, up to ``max_processes × memory_mib`` (measured:
8 processes × 200 MiB all held their memory under a 256 MiB ``memory_mib``), and kernel memory held by
pipes and socket buffers (not measured; bounded per process by RLIMIT_NOFILE and the kernel's per-socket limits).
:attr:`SandboxResult.enforcement` names the one used, and the first run logs it (a warning for the fallback).

Not covered: a general seccomp policy (the kernel's syscall surface is reachable, as for any unprivileged
process), and a CPU budget across processes (RLIMIT_CPU is per process; the wall clock bounds the total).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from harmonyrl.sandbox.cgroup import CgroupHost, find_cgroup_host, sandbox_cgroup
from harmonyrl.sandbox.launcher import LAUNCHER
from harmonyrl.sandbox.limits import NOTHING_HIDDEN, Enforcement, Hidden, SandboxLimits, SandboxUnavailable
from harmonyrl.sandbox.seccomp import memfd_guard

MIN_VERSION = (0, 8, 0)  # --disable-userns and --size
CODE_PATH = "/tmp/main.py"
_ETC = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/alternatives")
_TOP_DIRS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
_HELPERS = 1  # bwrap's own process under the code's uid (the pid-1 reaper, or the nested bwrap as root)
_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C.UTF-8"}
# bubblewrap's own environment: without root its pid-1 reaper is readable by the code (/proc/1/environ), so
# it gets nothing of the trainer's (API keys, tokens), only what a process needs to run
_BWRAP_ENV = {"PATH": _ENV["PATH"], "LANG": "C.UTF-8", "HOME": "/tmp"}
_LOG = logging.getLogger("harmonyrl.sandbox")


class _UidPool:
    """Host uids for root mode, one per concurrent sandbox, least recently used first.

    RLIMIT_NPROC counts all processes of a uid, so sandboxes sharing a uid would share one budget and a fork
    bomb in one episode would make another episode's code fail (a failure wrongly blamed on that model).
    Reusing the least recently freed uid gives a finished sandbox's processes time to be reaped. The block
    depends on the pid so two trainers on one host rarely overlap (if they do, they share budgets: fail closed).
    """

    SLOTS = 1024

    def __init__(self) -> None:
        self.base = 1_000_000 + (os.getpid() % 1000) * self.SLOTS
        self._free = collections.deque(range(self.base, self.base + self.SLOTS))

    def acquire(self) -> int:
        if not self._free:
            raise RuntimeError(f"more than {self.SLOTS} sandboxes at once")
        return self._free.popleft()

    def release(self, uid: int) -> None:
        self._free.append(uid)


_pools: dict[int, _UidPool] = {}  # by pid: a forked trainer must not hand out its parent's uids


def _uid_pool() -> _UidPool:
    return _pools.setdefault(os.getpid(), _UidPool())


@dataclass(frozen=True)
class Launch:
    """A ready-to-spawn command: ``status_fd`` is the read end the launcher writes "started" to."""

    argv: list[str]
    pass_fds: tuple[int, ...]
    cwd: str
    env: dict[str, str] | None
    status_fd: int
    isolated: bool
    enforcement: Enforcement

    def started(self) -> bool:
        """Whether the launcher got as far as exec'ing Python (read once the process has ended)."""
        try:
            return os.read(self.status_fd, 1) == b"1"
        except BlockingIOError:
            return False


def find_bwrap(path: str | None = None) -> str | None:
    """The bubblewrap binary to use: ``path`` if given (it must exist), else ``bwrap`` on PATH."""
    if path is not None:
        return path if os.access(path, os.X_OK) else None
    return shutil.which("bwrap")


@functools.cache
def _interpreter_roots(python: str) -> tuple[str, ...]:
    """Directories that must be visible for ``python`` to run: its prefix, base prefix and executable's home."""
    if python == sys.executable:
        prefixes = [sys.prefix, sys.base_prefix]
    else:
        # not -S: a venv's sys.prefix is set by site (3.11), and its site-packages are what the code imports
        probe = [python, "-I", "-c", "import sys; print(sys.prefix); print(sys.base_prefix)"]
        prefixes = subprocess.run(probe, capture_output=True, text=True, check=True, timeout=30).stdout.split()
    prefixes.append(os.path.dirname(os.path.dirname(os.path.abspath(python))))  # a venv: its bin/python links out
    prefixes.append(os.path.dirname(os.path.dirname(os.path.realpath(python))))
    return tuple(dict.fromkeys(os.path.realpath(p) for p in prefixes))


def _ro_binds(paths: tuple[str, ...]) -> list[str]:
    """Read-only binds of ``paths`` (skipping those under ``/usr``), parents created world-traversable.

    Paths under ``/tmp`` (an interpreter in a venv there) are bound after the private ``/tmp`` is mounted,
    on top of it, or the tmpfs would hide them: the caller places those arguments after ``--tmpfs /tmp``.
    """
    args: list[str] = []
    made: set[str] = {"/", "/tmp"}
    for path in _bind_order(paths):
        parents = [os.path.dirname(path)]
        while parents[-1] not in made:
            parents.append(os.path.dirname(parents[-1]))
        for parent in reversed(parents[:-1]):
            args += ["--perms", "0755", "--dir", parent]
            made.add(parent)
        args += ["--ro-bind", path, path]
        made.add(path)
    return args


def _bind_order(paths: tuple[str, ...]) -> list[str]:
    """The paths to bind, parents first (those under ``/usr`` come with ``/usr``)."""
    return [p for p in sorted(set(paths)) if not (p == "/usr" or p.startswith("/usr/"))]


def _under_tmp(path: str) -> bool:
    return path == "/tmp" or path.startswith("/tmp/")


def _extra_roots(python: str, bwrap: str) -> tuple[str, ...]:
    """Directories mounted beside ``/usr`` and the top-level system directories: the interpreter's, bwrap's."""
    return (*_interpreter_roots(python), os.path.dirname(os.path.realpath(bwrap)))


def visible_roots(python: str, bwrap: str) -> tuple[str, ...]:
    """Every host directory the sandbox shows (read-only) for ``python``: what must be searched to hide a thing."""
    top = [f"/{name}" for name in _TOP_DIRS if os.path.isdir(f"/{name}") and not os.path.islink(f"/{name}")]
    return tuple(dict.fromkeys(["/usr", *top, *_extra_roots(python, bwrap)]))


def _covers(hidden: Hidden) -> list[str]:
    """Mounts that make ``hidden`` absent: an empty read-only tmpfs over each directory, ``/dev/null`` over each file.

    Placed after every bind (those under ``/tmp`` included), so nothing mounted later uncovers them. The bound
    ``/dev/null`` sits on a ``nodev`` mount, so opening the covered file fails (EACCES) rather than reading empty.
    """
    args: list[str] = []
    for path in hidden.dirs:
        args += ["--perms", "0555", "--size", "4096", "--tmpfs", path, "--remount-ro", path]
    for path in hidden.files:
        args += ["--ro-bind", "/dev/null", path]
    return args


@dataclass(frozen=True)
class Guards:
    """What bounds the whole sandbox: the cgroup descriptors the launcher joins, or the fallback's seccomp filter."""

    cgroup_fds: tuple[int, ...] = ()
    seccomp_fd: int | None = None


def bwrap_argv(
    bwrap: str,
    python: str,
    limits: SandboxLimits,
    *,
    code_fd: int,
    status_fd: int,
    uid: int | None,
    guards: Guards = Guards(),
    hidden: Hidden = NOTHING_HIDDEN,
) -> list[str]:
    """The full command for one sandboxed run (``uid`` is set in root mode, see the module docstring)."""
    if uid is None:  # CAP_SYS_ADMIN inside the sandbox's own user namespace, for the launcher's /tmp remount
        namespaces = ["--unshare-all", "--unshare-user", "--disable-userns", "--cap-add", "CAP_SYS_ADMIN"]
        final = [python, "-I", "-u", CODE_PATH]
    else:
        namespaces = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
        namespaces += ["--cap-drop", "ALL"]
        namespaces += [arg for cap in ("CAP_SETUID", "CAP_SETGID", "CAP_SYS_ADMIN") for arg in ("--cap-add", cap)]
        inner = [bwrap, "--unshare-user", "--disable-userns", "--dev-bind", "/", "/", "--die-with-parent"]
        final = [*inner, "--chdir", "/tmp", "--", python, "-I", "-u", CODE_PATH]
    mounts = ["--ro-bind", "/usr", "/usr"]
    for name in _TOP_DIRS:
        path = f"/{name}"
        if os.path.islink(path):
            mounts += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            mounts += ["--ro-bind", path, path]
    for path in _ETC:
        mounts += ["--ro-bind-try", path, path]
    roots = _extra_roots(python, bwrap)
    mounts += _ro_binds(tuple(p for p in roots if not _under_tmp(p)))
    mounts += ["--proc", "/proc", "--dev", "/dev"]
    mounts += ["--perms", "1777", "--size", str(limits.tmp_mib << 20), "--tmpfs", "/tmp"]
    mounts += _ro_binds(tuple(p for p in roots if _under_tmp(p)))
    mounts += _covers(hidden)
    mounts += ["--perms", "0444", "--file", str(code_fd), CODE_PATH, "--chdir", "/tmp"]
    mounts += ["--remount-ro", "/dev", "--remount-ro", "/"]  # bwrap's own tmpfs roots are unbounded: freeze them
    env = ["--clearenv", "--setenv", "HOME", "/tmp", "--setenv", "TMPDIR", "/tmp"]
    for key, value in _ENV.items():
        env += ["--setenv", key, value]
    session = ["--die-with-parent", "--new-session", "--hostname", "sandbox"]
    if guards.seccomp_fd is not None:
        session += ["--seccomp", str(guards.seccomp_fd)]
    config = {
        "rlimits": limits.rlimits(_HELPERS),
        "uid": uid,
        "status_fd": status_fd,
        "argv": final,
        "cgroup_fds": list(guards.cgroup_fds),
        "tmp": f"size={limits.tmp_mib << 20},nr_inodes={limits.tmp_inodes},mode=1777",
        "tmp_binds": [p for p in _bind_order(roots) if _under_tmp(p)],
    }
    launcher = [python, "-I", "-S", "-c", LAUNCHER, json.dumps(config)]
    return [bwrap, *namespaces, *session, *mounts, *env, "--", *launcher]


@functools.cache
def cgroup_host() -> CgroupHost | str:
    """Where this process makes per-sandbox cgroups, or why it cannot (measured once per process)."""
    return find_cgroup_host()


def _guards(limits: SandboxLimits, stack: contextlib.ExitStack) -> tuple[Guards, Enforcement]:
    """A cgroup for the run if policy and host allow, else the fallback's seccomp filter (see the module docstring)."""
    host = cgroup_host() if limits.cgroup != "off" else "cgroup='off' in SandboxLimits"
    if isinstance(host, CgroupHost):
        _announce(f"sandbox: each run gets a {host.kind} cgroup under {host.memory_dir} (memory + pids budget)")
        fds = stack.enter_context(sandbox_cgroup(host, limits.budget_mib << 20, limits.max_processes + _HELPERS))
        return Guards(cgroup_fds=fds), host.kind
    if limits.cgroup == "require":
        raise SandboxUnavailable(f"SandboxLimits(cgroup='require') but no cgroup is usable here: {host}")
    if limits.cgroup == "auto":
        _announce(
            f"sandbox: no cgroup usable ({host}); falling back to per-process rlimits: memory is bounded per "
            "process (memory_mib), not per sandbox (up to max_processes x memory_mib), memfd/SysV shm are refused"
        )
    program = memfd_guard()
    if program is None:
        return Guards(), "rlimits"
    fd = os.memfd_create("seccomp")
    stack.callback(os.close, fd)
    os.write(fd, program)
    os.lseek(fd, 0, os.SEEK_SET)
    return Guards(seccomp_fd=fd), "rlimits"


@functools.cache
def _announce(line: str) -> None:
    """Say once per process how the sandbox is bounded: a user must know when it is only the fallback."""
    (_LOG.info if line.startswith("sandbox: each run") else _LOG.warning)(line)


@contextlib.contextmanager
def prepare(
    code: str, limits: SandboxLimits, *, bwrap: str | None, python: str, hidden: Hidden = NOTHING_HIDDEN
) -> Iterator[Launch]:
    """Files, pipes, the cgroup and (root mode) a uid for one run; ``bwrap=None`` prepares the unsafe fallback.

    Raises:
        SandboxUnavailable: ``hidden`` is not empty and there is no bubblewrap: nothing can be hidden then.
    """
    if bwrap is None and hidden:
        raise SandboxUnavailable(
            f"{len(hidden.dirs) + len(hidden.files)} path(s) must be absent from the sandbox's view, which needs "
            "bubblewrap (apt-get install bubblewrap); allow_unsafe=True cannot hide anything"
        )
    status_r, status_w = os.pipe()
    os.set_blocking(status_r, False)
    with contextlib.ExitStack() as stack:
        for fd in (status_r, status_w):
            stack.callback(os.close, fd)
        if bwrap is None:
            workdir = stack.enter_context(tempfile.TemporaryDirectory(prefix="harmonyrl-unsafe-"))
            with open(os.path.join(workdir, "main.py"), "wb") as f:
                f.write(code.encode("utf-8", errors="surrogatepass"))
            final = [python, "-I", "-u", "main.py"]
            config = {"rlimits": limits.rlimits(), "uid": None, "status_fd": status_w, "argv": final}
            config.update(cgroup_fds=[], tmp=None, tmp_binds=[])
            argv = [python, "-I", "-S", "-c", LAUNCHER, json.dumps(config)]
            env = {**_ENV, "HOME": workdir, "TMPDIR": workdir}
            yield Launch(argv, (status_w,), workdir, env, status_r, isolated=False, enforcement="none")
            return
        code_fd = os.memfd_create("main.py")
        stack.callback(os.close, code_fd)
        os.write(code_fd, code.encode("utf-8", errors="surrogatepass"))
        os.lseek(code_fd, 0, os.SEEK_SET)
        uid = None
        if os.geteuid() == 0:
            pool = _uid_pool()
            uid = pool.acquire()
            stack.callback(pool.release, uid)
        guards, enforcement = _guards(limits, stack)
        argv = bwrap_argv(
            bwrap, python, limits, code_fd=code_fd, status_fd=status_w, uid=uid, guards=guards, hidden=hidden
        )
        fds = (code_fd, status_w, *guards.cgroup_fds, *([guards.seccomp_fd] if guards.seccomp_fd is not None else []))
        yield Launch(argv, fds, "/", dict(_BWRAP_ENV), status_r, isolated=True, enforcement=enforcement)


def _check_uid_map(base: int, count: int) -> None:
    with open("/proc/self/uid_map") as f:
        ranges = [tuple(map(int, line.split())) for line in f]
    if not any(inner <= base and base + count <= inner + n for inner, _, n in ranges):
        raise SandboxUnavailable(
            f"running as root, the sandbox gives each run its own uid from {base}..{base + count - 1}, "
            "but those uids are not mapped in this container (/proc/self/uid_map); run as a non-root user"
        )


_checked: dict[tuple[str, str, int], str | SandboxUnavailable] = {}
_lock = threading.Lock()


def check_sandbox(bwrap: str | None = None, python: str | None = None) -> str:
    """Resolve bubblewrap and prove once per process that a real sandbox starts here; return its path.

    Raises :class:`SandboxUnavailable` with the measured cause (missing binary, too old, or namespaces
    forbidden by the container). Blocking (about 0.1 s), cached per (bwrap, python, euid).
    """
    python = python or sys.executable
    path = find_bwrap(bwrap)
    if path is None:
        where = bwrap if bwrap is not None else "bwrap on PATH"
        raise SandboxUnavailable(
            f"bubblewrap not found ({where}): apt-get install bubblewrap, "
            "or pass allow_unsafe=True to run model code without isolation"
        )
    key = (path, python, os.geteuid())
    with _lock:  # the first episodes of a run arrive together; probe once, not once each
        if key not in _checked:
            try:
                _probe(path, python)
                _checked[key] = path
            except SandboxUnavailable as e:
                _checked[key] = e
            except (OSError, subprocess.SubprocessError) as e:
                _checked[key] = SandboxUnavailable(f"checking bubblewrap at {path} with {python} failed: {e}")
    outcome = _checked[key]
    if isinstance(outcome, SandboxUnavailable):
        raise outcome
    return outcome


def _probe(path: str, python: str) -> None:
    version = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    found = tuple(int(x) for x in re.findall(r"\d+", version)[:3])
    if found < MIN_VERSION:
        need = ".".join(map(str, MIN_VERSION))
        raise SandboxUnavailable(f"bubblewrap {version.strip() or '?'} at {path} is too old: {need} or newer needed")
    if os.geteuid() == 0:
        _check_uid_map(_uid_pool().base, _UidPool.SLOTS)
    limits = SandboxLimits(timeout_s=30)
    with prepare("print('ok')", limits, bwrap=path, python=python) as launch:
        run = subprocess.run(launch.argv, pass_fds=launch.pass_fds, cwd=launch.cwd, capture_output=True, timeout=30)
        if run.returncode != 0 or run.stdout != b"ok\n" or not launch.started():
            detail = run.stderr.decode(errors="replace").strip()[-500:]
            raise SandboxUnavailable(
                f"bubblewrap at {path} cannot create a sandbox here (exit {run.returncode}): {detail}. "
                "Containers often forbid namespaces; allow them (e.g. docker --security-opt seccomp=unconfined "
                "--cap-add SYS_ADMIN), or pass allow_unsafe=True to run model code without isolation"
            )
