"""Value types of the sandbox: what a run may use (:class:`SandboxLimits`) and what came of it (:class:`SandboxResult`).

Plain frozen dataclasses rather than pydantic models on purpose: the sandbox core imports nothing but the
standard library, so any interpreter (including a bare system Python running as an unprivileged user) can
drive it, and the model's code never depends on the trainer's environment.

The status vocabulary draws the line of invariant 5 of the architecture: ``ok``, ``error``, ``timeout``,
``killed`` and ``output_limit`` describe the model's code (an observation the model learns from), while
``sandbox_failure`` means the sandbox itself could not start (the environment's fault: masked, never scored).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Status = Literal["ok", "error", "timeout", "killed", "output_limit", "sandbox_failure"]
Enforcement = Literal["cgroup2", "cgroup1", "rlimits", "none"]
"""How the sandbox's total memory and process budget was enforced for a run: a cgroup (v2 or v1) of its own
(every process and every memory-backed file counted together), per-process rlimits only (the fallback, see
:mod:`harmonyrl.sandbox.bwrap`), or ``none`` (the unsafe opt-in, no isolation at all)."""
CgroupPolicy = Literal["auto", "require", "off"]
MODEL_STATUSES: frozenset[Status] = frozenset({"ok", "error", "timeout", "killed", "output_limit"})
"""Outcomes caused by the model's code. Everything else (``sandbox_failure``) is an environment fault."""

_MIB = 1 << 20
MIN_MEMORY_MIB = 32
MIN_OPEN_FILES = 16


class SandboxUnavailable(RuntimeError):
    """bubblewrap is missing or cannot isolate here, and unsafe local execution was not allowed."""

    failure_kind = "sandbox_error"  # raised inside a tool call: an environment fault, masked


class UnsafeExecutionWarning(RuntimeWarning):
    """Model-written code is running without isolation (``allow_unsafe=True`` and no working bubblewrap)."""


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one run. Network access is always off; there is deliberately no switch for it.

    Attributes:
        timeout_s: Wall-clock limit, measured from process start; exceeded → status ``timeout``.
        cpu_s: CPU seconds per process (RLIMIT_CPU; SIGXCPU, then SIGKILL a second later) → ``killed``.
        memory_mib: Address space per process (RLIMIT_AS). Allocations fail with MemoryError.
        max_processes: Processes and threads the code may have at once (RLIMIT_NPROC, per sandbox; also
            the cgroup's ``pids.max`` when there is one).
        max_file_mib: Largest file the code may write (RLIMIT_FSIZE).
        tmp_mib: Size of the private writable ``/tmp`` (the only writable place), so many files cannot
            exhaust host memory either.
        max_output_bytes: stdout + stderr kept; beyond it the process is stopped → ``output_limit``.
        max_open_files: Open file descriptors per process (RLIMIT_NOFILE).
        tmp_inodes: Files and directories the private ``/tmp`` may hold (tmpfs ``nr_inodes``): empty files
            cost kernel memory that ``tmp_mib`` does not count.
        total_memory_mib: Memory of the whole sandbox — all its processes, its ``/tmp`` and memory-backed
            files (``memfd``, shared memory) together — enforced by a cgroup of its own where the host
            offers one (``None``: ``memory_mib + tmp_mib``). Past it the kernel kills a process → ``killed``.
        cgroup: ``auto`` uses a per-sandbox cgroup when the host offers one and falls back to rlimits (with
            a one-time warning naming why); ``require`` refuses to run without one (:class:`SandboxUnavailable`);
            ``off`` always uses the fallback. :attr:`SandboxResult.enforcement` says which was used.
    """

    timeout_s: float = 10.0
    cpu_s: int = 10
    memory_mib: int = 512
    max_processes: int = 32
    max_file_mib: int = 16
    tmp_mib: int = 64
    max_output_bytes: int = 16_384
    max_open_files: int = 256
    tmp_inodes: int = 4096
    total_memory_mib: int | None = None
    cgroup: CgroupPolicy = "auto"

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if isinstance(value, (int, float)) and not value > 0:
                raise ValueError(f"SandboxLimits.{name} must be positive, got {value!r}")
        if self.memory_mib < MIN_MEMORY_MIB:  # below it Python fails to start, which would look like the code's error
            raise ValueError(
                f"SandboxLimits.memory_mib must be at least {MIN_MEMORY_MIB} (Python needs ~16 MiB to start)"
            )
        if self.max_open_files < MIN_OPEN_FILES:  # Python opens a few files to start; below that it cannot run
            raise ValueError(f"SandboxLimits.max_open_files must be at least {MIN_OPEN_FILES}")
        if self.budget_mib < MIN_MEMORY_MIB:
            raise ValueError(f"SandboxLimits.total_memory_mib must be at least {MIN_MEMORY_MIB}")
        if self.cgroup not in ("auto", "require", "off"):
            raise ValueError(f"SandboxLimits.cgroup must be 'auto', 'require' or 'off', got {self.cgroup!r}")

    @property
    def budget_mib(self) -> int:
        """The whole sandbox's memory budget (the cgroup's limit): ``total_memory_mib`` or its default."""
        return self.total_memory_mib if self.total_memory_mib is not None else self.memory_mib + self.tmp_mib

    def rlimits(self, extra_processes: int = 0) -> dict[str, tuple[int, int]]:
        """The limits as ``resource.setrlimit`` arguments, keyed by constant name (JSON-friendly for the launcher).

        ``extra_processes`` reserves room for the sandbox's own helper processes, which count against the
        same per-uid budget as the model's.
        """
        nproc = self.max_processes + extra_processes
        return {
            "RLIMIT_CPU": (self.cpu_s, self.cpu_s + 1),  # soft: SIGXCPU; hard: SIGKILL a second later
            "RLIMIT_AS": (self.memory_mib * _MIB, self.memory_mib * _MIB),
            "RLIMIT_NPROC": (nproc, nproc),
            "RLIMIT_FSIZE": (self.max_file_mib * _MIB, self.max_file_mib * _MIB),
            "RLIMIT_CORE": (0, 0),
            "RLIMIT_NOFILE": (self.max_open_files, self.max_open_files),
        }


@dataclass(frozen=True)
class Hidden:
    """What a sandbox's view leaves out: each directory is shown empty, each file unreadable (mounted over).

    Absence, not denial: the paths are covered in the sandbox's own mount namespace, so no symlink,
    ``/proc/self/root`` route or second name of the same path reaches what lies under them. Only bubblewrap
    can do that, so a run with anything hidden refuses the unsafe fallback (:class:`SandboxUnavailable`).
    Paths are absolute, resolved (no symlinks), and lie under a directory the sandbox mounts.
    """

    dirs: tuple[str, ...] = ()
    files: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.dirs or self.files)


NOTHING_HIDDEN = Hidden()
"""The default view: everything the sandbox mounts is visible."""


@dataclass(frozen=True)
class SandboxResult:
    """What one run produced. ``stdout``/``stderr`` are decoded as UTF-8 (invalid bytes replaced).

    ``exit_code`` is the program's exit status, ``128 + signal`` when a signal ended it (bubblewrap's
    convention), ``None`` when it was stopped for a limit (timeout, output), and bubblewrap's own status for a
    ``sandbox_failure``. ``isolated`` is False only for the opt-in unsafe fallback. ``enforcement`` says how
    the whole sandbox's memory and processes were bounded (a cgroup, or per-process rlimits only).
    """

    status: Status
    exit_code: int | None
    stdout: str
    stderr: str
    duration_s: float
    truncated: bool
    isolated: bool = True
    enforcement: Enforcement = "rlimits"

    @property
    def env_fault(self) -> bool:
        """True when the sandbox itself failed: the outcome says nothing about the model's code."""
        return self.status not in MODEL_STATUSES
