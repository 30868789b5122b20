"""How many threads the intra-op pool (torch's and the C decode step's OpenMP team) should use right now.

Why adapt: OpenMP splits each parallel region statically across its team, and libgomp's threads spin at every
barrier. On a shared CPU a thread that loses its core to another process holds up the whole region while its
partner spins, so two threads beside one busy process run slower than one thread (docs/contention.md: an SFT
step 3x slower, two runs side by side 50x slower). The passive wait policy removes the spinning but costs
2-2.5x on an idle virtual machine (every wake-up of a halted vCPU is slow), so the team size adapts instead:
as many threads as cores that other processes leave free, measured as the CPU time the whole machine spent
busy (``/proc/stat``) minus this process's own, over the last :data:`WINDOW_S`, looked at most every
:data:`INTERVAL_S`. CPU time, not the instantaneous runnable count of ``/proc/loadavg``: on an idle VM stray
kernel threads are runnable often enough to halve a team that looks at the count, but they use little time.

Opt-in (``adaptive_threads=true``), because it costs bit-reproducibility: a run's numerics depend on the team
size. Measured 2026-11-25 (``tests/test_team_invariance.py``): torch's CPU softmax backward (avoided by the
``harmonyrl_eager`` kernel), single reductions over more than 32,768 elements (the losses sum rows first) and MKL's
matrix products for a few rows (M = 5-7 of ``[1, M, 64] @ [64, 128]``: an engine's prefill, a shared prompt; even
``MKL_CBWR=AUTO,STRICT`` leaves some) all round differently with one thread and two. ``threads > 0`` fixes the
team; by default it is fixed at the cores this process may use.
"""

from __future__ import annotations

import math
import os
import time
from collections import deque
from pathlib import Path

INTERVAL_S = 0.1
"""Least time between two looks at the machine's load (a look reads ``/proc/stat``: ~20 us)."""

WINDOW_S = 1.0
"""The load is the CPU time others used over about this long: long enough that a shell command or a kernel
worker's blip does not halve the team, short enough to follow a job that starts or stops."""

TAKEN = 0.7
"""``floor(busy + TAKEN)``: a core others use at least 30 % of the time is not free."""


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


def threads_for(cores: int, others_busy: float) -> int:
    """Team size for ``cores`` usable cores when other processes keep ``others_busy`` cores busy on average:
    the free cores, at least one. A core counts as taken from 0.3 of its time on (a busy loop: 1.0; kernel
    workers and an agent's blips: a few hundredths)."""
    return max(1, min(cores, cores - math.floor(others_busy + TAKEN)))


def busy_seconds(proc_stat: str) -> tuple[float, float]:
    """``(busy, total)`` CPU seconds of the whole machine from ``/proc/stat``'s ``cpu`` line. Busy counts user,
    nice, system, irq, softirq and steal (time the hypervisor gave to another guest is not ours either)."""
    fields = [int(x) for x in proc_stat.split("\n", 1)[0].split()[1:9]]
    user, nice, system, idle, iowait, irq, softirq, steal = fields + [0] * (8 - len(fields))
    busy = user + nice + system + irq + softirq + steal
    tick = os.sysconf("SC_CLK_TCK")
    return busy / tick, (busy + idle + iowait) / tick


class ThreadGovernor:
    """The team size to use now (:meth:`threads`), for at most ``cores`` threads; see the module docstring."""

    def __init__(self, cores: int, proc_stat: Path = Path("/proc/stat")) -> None:
        self.cores = cores
        self._proc_stat = proc_stat
        self._looks: deque[tuple[float, float, float]] = deque()  # (wall, machine busy, own CPU) seconds
        self._last = -math.inf
        self._threads = cores

    def threads(self) -> int:
        """Free cores over the last :data:`WINDOW_S`, re-checked at most every :data:`INTERVAL_S`."""
        now = time.monotonic()
        if self.cores <= 1 or now - self._last < INTERVAL_S:
            return self._threads
        self._last = now
        text = _read(self._proc_stat)
        if text is None:  # not Linux: keep every core, as before
            return self._threads
        look = (now, busy_seconds(text)[0], time.process_time())
        self._looks.append(look)
        while len(self._looks) > 2 and now - self._looks[1][0] >= WINDOW_S:
            self._looks.popleft()  # keep one look at least WINDOW_S old as the window's start
        wall = now - self._looks[0][0]
        if wall > 0 and wall >= INTERVAL_S:
            others = (look[1] - self._looks[0][1]) - (look[2] - self._looks[0][2])
            self._threads = threads_for(self.cores, max(0.0, others) / wall)
        return self._threads


_governor: ThreadGovernor | None = None
_hook: object | None = None


def adapt() -> int:
    """Resize torch's intra-op team (which the C decode step shares) to what the installed governor says now;
    returns the team size to use. Without a governor (fixed ``threads``, or adaptation off): torch's count."""
    import torch

    if _governor is not None:
        n = _governor.threads()
        if n != torch.get_num_threads():
            torch.set_num_threads(n)
    return torch.get_num_threads()


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
    torch.set_num_threads(cores)
    if not adaptive:
        return
    _governor = ThreadGovernor(cores)
    if _hook is None:  # one global hook: training steps run on the thread that calls configure()
        _hook = register_optimizer_step_pre_hook(_before_step)


def _before_step(*_: object) -> None:
    adapt()
