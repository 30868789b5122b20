"""How many threads the intra-op pool (torch's and the C decode step's OpenMP team) should use right now.

Why adapt: OpenMP splits each parallel region statically across its team, and libgomp's threads spin at every
barrier. On a shared CPU a thread that loses its core to another process holds up the whole region while its
partner spins, so two threads beside one busy process run slower than one thread (docs/contention.md: an SFT
step 3x slower, two runs side by side 50x slower). The passive wait policy removes the spinning but costs
2-2.5x on an idle virtual machine (every wake-up of a halted vCPU is slow), so the thread count adapts instead:
as many threads as cores that no other thread of equal or higher priority has wanted for the last
:data:`WINDOW_S`, from ``/proc/loadavg``'s instantaneous count of runnable threads minus this process's own, looked
at most every :data:`INTERVAL_S` (and, when that count says someone else runs, which threads and at what priority).

The default (``adaptive_threads=true``) since 2026-11-26, because it no longer costs reproducibility: a run gives
the same bits with any thread count. What made the numerics thread-count-dependent, and what removed it (measured
by hashing every op's output with one thread and two, docs/contention.md): torch's CPU softmax backward (the
``harmonyrl_eager`` kernel, the default, avoids it), single reductions over more than 32,768 elements (the losses
sum rows first), MKL's matrix products of a few rows and of some MoE group sizes (MKL's strict reproducibility
mode, ``MKL_CBWR=AUTO,STRICT``, which ``import harmonyrl`` sets) and the engine's prefill (batch-invariant since
2026-11-26). :func:`configure` checks the MKL mode took effect (:func:`products_are_thread_invariant`) and keeps a
fixed team, with a warning, when it did not. ``threads > 0`` fixes the team explicitly.
"""

from __future__ import annotations

import math
import os
import time
import warnings
from collections import deque
from pathlib import Path

INTERVAL_S = 0.1
"""Least time between two looks at the machine's load (a look costs ~50 us)."""

SCAN_S = 0.5
"""Least time between two scans of every thread's priority (:func:`competing_runnable`, ~3 ms); in between, a look
takes the load average's count, capped by the last scan's."""

WINDOW_S = 1.0
"""Another thread counts only if it was runnable at every look over at least this long: kernel workers, a shell
command or the VM's agent come and go within it (they made an instantaneous count drop to one thread on an idle
machine), a busy loop or a second run stays."""


def quota_cores(cpu_max: str | None, cfs_quota: str | None = None, cfs_period: str | None = None) -> int | None:
    """Cores a cgroup's CPU quota allows (rounded up), or None without a quota. ``cpu_max`` is cgroup v2's
    ``cpu.max`` (``"max 100000"`` or ``"150000 100000"``); ``cfs_quota``/``cfs_period`` are cgroup v1's
    ``cpu.cfs_quota_us`` (``-1``: none) and ``cpu.cfs_period_us``."""
    if cpu_max is not None:
        quota, _, period = cpu_max.strip().partition(" ")
        if quota == "max" or not period:
            return None
        return max(1, math.ceil(int(quota) / int(period)))
    if cfs_quota is None or cfs_period is None or int(cfs_quota) <= 0:
        return None
    return max(1, math.ceil(int(cfs_quota) / int(cfs_period)))


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def available_cores(cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """Cores this process may use: its affinity mask, capped by its cgroup's CPU quota (v2 or v1)."""
    cores = len(os.sched_getaffinity(0))
    v1 = cgroup / "cpu"
    quota = quota_cores(_read(cgroup / "cpu.max"), _read(v1 / "cpu.cfs_quota_us"), _read(v1 / "cpu.cfs_period_us"))
    return cores if quota is None else min(cores, quota)


def threads_for(cores: int, others_running: int) -> int:
    """Team size for ``cores`` usable cores when ``others_running`` threads of other processes want a core:
    the free cores, at least one."""
    return max(1, min(cores, cores - others_running))


def runnable_in_loadavg(loadavg: str) -> int:
    """The machine's runnable threads right now: the ``R`` of ``/proc/loadavg``'s fourth field ``R/T``."""
    return int(loadavg.split()[3].split("/")[0])


def own_runnable() -> int:
    """Threads of this process that are runnable (state ``R``), counted so they are not taken for others."""
    n = 0
    for stat in Path("/proc/self/task").glob("*/stat"):
        text = _read(stat)
        if text is not None and text[text.rfind(")") + 2 :].startswith("R"):
            n += 1
    return n


def state_and_nice(stat: str) -> tuple[str, int]:
    """A ``/proc/PID/task/TID/stat`` line's scheduler state (``R``: runnable) and nice value (fields 3 and 19)."""
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[0], int(fields[16])


def autogroup_nice(text: str | None) -> int:
    """``/proc/PID/autogroup`` (``"/autogroup-25 nice 19"``) → 19; 0 when there is none (no autogroups, a kernel
    thread)."""
    if not text or " nice " not in text:
        return 0
    return int(text.rsplit(" nice ", 1)[1])


def competing_runnable(proc: Path = Path("/proc")) -> int:
    """Runnable threads of other processes that compete with this one on equal terms: none at a lower priority
    (a higher nice, or a higher autogroup nice). Beside a thread at nice 0 the scheduler gives a nice-19 one ~1.5 %
    of a core, so a low-priority background job leaves this run its cores. ~1 ms for ~150 threads."""
    me = str(os.getpid())
    own_nice = os.getpriority(os.PRIO_PROCESS, 0)
    own_group = autogroup_nice(_read(proc / me / "autogroup"))
    n = 0
    for pid in os.listdir(proc):
        if not pid.isdigit() or pid == me:
            continue
        try:
            tids = os.listdir(f"{proc}/{pid}/task")
        except OSError:  # the process ended
            continue
        runnable = 0
        for tid in tids:
            try:
                with open(f"{proc}/{pid}/task/{tid}/stat") as f:
                    state, nice = state_and_nice(f.read())
            except (OSError, IndexError, ValueError):
                continue
            runnable += state == "R" and nice <= own_nice
        if runnable and autogroup_nice(_read(proc / pid / "autogroup")) <= own_group:  # read once per process
            n += runnable
    return n


class ThreadGovernor:
    """The thread count to use now (:meth:`threads`), for at most ``cores`` threads; see the module docstring."""

    def __init__(self, cores: int, loadavg: Path = Path("/proc/loadavg"), proc: Path = Path("/proc")) -> None:
        self.cores = cores
        self._loadavg = loadavg
        self._proc = proc
        self._scanned = (-math.inf, 0)  # (when, competing threads then)
        self._looks: deque[tuple[float, int]] = deque()  # (when, other runnable threads), spanning >= WINDOW_S
        self._last = -math.inf
        self._threads = cores

    def threads(self) -> int:
        """Free cores: the fewest competing runnable threads seen over the last :data:`WINDOW_S` (and the look just
        before it) taken from :attr:`cores`, none until the looks span the window; re-checked at most every
        :data:`INTERVAL_S`. The load average's count of runnable threads says whether anyone else runs (cheap);
        only then are the threads looked at one by one, at most every :data:`SCAN_S`, to leave out lower-priority
        ones (:func:`competing_runnable`)."""
        now = time.monotonic()
        if self.cores <= 1 or now - self._last < INTERVAL_S:
            return self._threads
        self._last = now
        text = _read(self._loadavg)
        if text is None:  # not Linux: keep every core, as before
            return self._threads
        others = max(0, runnable_in_loadavg(text) - own_runnable())
        if others and now - self._scanned[0] >= SCAN_S:
            self._scanned = (now, competing_runnable(self._proc))
        self._looks.append((now, min(others, self._scanned[1])))
        while len(self._looks) > 1 and now - self._looks[1][0] >= WINDOW_S:
            self._looks.popleft()  # the oldest look kept is the last one at least WINDOW_S old
        proven = now - self._looks[0][0] >= WINDOW_S  # a first busy look alone does not take a core away
        self._threads = threads_for(self.cores, min(n for _, n in self._looks) if proven else 0)
        return self._threads


_governor: ThreadGovernor | None = None
_hook: object | None = None


def adapt() -> int:
    """Resize torch's intra-op team (which the C decode step shares) to what the installed governor says now;
    returns the thread count to use. Without a governor (fixed ``threads``, or adaptation off): torch's count."""
    import torch

    if _governor is not None:
        n = _governor.threads()
        if n != torch.get_num_threads():
            torch.set_num_threads(n)
    return torch.get_num_threads()


def products_are_thread_invariant() -> bool:
    """Whether torch's matrix products are MKL's in strict mode, checked on a product of 7 rows (one MKL rounds
    differently with 1 and 2 threads outside that mode) with a team of one and of two: false when torch ran a
    product before ``import harmonyrl`` set ``MKL_CBWR``, the user set another mode, or this torch has no MKL (other
    BLAS libraries were not checked for thread-count-invariance). Leaves the team at two threads."""
    import torch

    if not torch.backends.mkl.is_available():
        return False
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(7, 64, generator=g), torch.randn(128, 64, generator=g)
    out = []
    for n in (1, 2):
        torch.set_num_threads(n)
        out.append(x @ w.T)
    return torch.equal(out[0], out[1])


def configure(threads: int, adaptive: bool = False) -> None:
    """The process's intra-op threads: ``threads > 0`` fixes them; 0 fixes them at the cores this process may
    use, or with ``adaptive`` resizes them to the free cores (before every optimizer step and every compiled
    decode step)."""
    global _governor, _hook
    import torch
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    _governor = None
    if threads > 0:
        torch.set_num_threads(threads)
        return
    cores = available_cores()
    if adaptive and cores > 1 and not products_are_thread_invariant():
        warnings.warn(
            f"MKL's strict reproducibility mode is not in effect (MKL_CBWR={os.environ.get('MKL_CBWR')!r}; a matrix "
            "product ran before 'import harmonyrl', or torch without MKL?): the thread team stays fixed at "
            f"{cores}, so that results do not depend on the load (docs/contention.md)",
            RuntimeWarning,
            stacklevel=2,
        )
        adaptive = False
    torch.set_num_threads(cores)
    if not adaptive:
        return
    _governor = ThreadGovernor(cores)
    if _hook is None:  # one global hook: training steps run on the thread that calls configure()
        _hook = register_optimizer_step_pre_hook(_before_step)


def _before_step(*_: object) -> None:
    adapt()
