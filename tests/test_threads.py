"""The intra-op team size: cores from affinity and cgroup quota, free cores from the load, and the hooks."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from harmonyrl import threads
from harmonyrl.threads import ThreadGovernor, available_cores, busy_seconds, quota_cores, threads_for

TICK = os.sysconf("SC_CLK_TCK")


@pytest.fixture(autouse=True)
def restore_threads(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    before = torch.get_num_threads()
    monkeypatch.setattr(threads, "INTERVAL_S", 0.0)  # every call looks again
    yield
    threads._governor = None
    torch.set_num_threads(before)


class Machine:
    """A fake clock, process CPU clock and ``/proc/stat`` for the governor."""

    def __init__(self, path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.path, self.wall, self.own, self.busy = path, 100.0, 0.0, 0.0
        monkeypatch.setattr(threads.time, "monotonic", lambda: self.wall)
        monkeypatch.setattr(threads.time, "process_time", lambda: self.own)
        self.write()

    def write(self) -> None:
        busy = round(self.busy * TICK)  # user nice system idle iowait irq softirq steal
        self.path.write_text(f"cpu  {busy} 0 0 {10**6} 0 0 0 0 0 0\ncpu0 1 2 3 4\n")

    def run(self, seconds: float, own_cores: float, other_cores: float) -> None:
        self.wall += seconds
        self.own += seconds * own_cores
        self.busy += seconds * (own_cores + other_cores)
        self.write()


def test_quota_cores_reads_cgroup_v2_and_v1() -> None:
    assert quota_cores("max 100000\n") is None
    assert quota_cores("150000 100000\n") == 2  # 1.5 cores: the second one is partly usable
    assert quota_cores("50000 100000") == 1
    assert quota_cores(None, "-1", "100000") is None
    assert quota_cores(None, "300000\n", "100000\n") == 3
    assert quota_cores(None) is None


def test_available_cores_is_affinity_capped_by_quota(tmp_path: Path) -> None:
    affinity = len(os.sched_getaffinity(0))
    assert available_cores(tmp_path) == affinity  # no cgroup files: the mask decides
    (tmp_path / "cpu.max").write_text("100000 100000\n")
    assert available_cores(tmp_path) == 1
    (tmp_path / "cpu.max").unlink()
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert available_cores(tmp_path) == affinity


def test_threads_for_counts_free_cores_at_least_one() -> None:
    assert threads_for(2, 0.0) == 2
    assert threads_for(2, 0.05) == 2  # kernel workers' blips leave the core free
    assert threads_for(2, 0.3) == 1  # a core used 30 % of the time by others is taken
    assert threads_for(2, 1.0) == 1  # a busy loop takes one of two cores
    assert threads_for(2, 7.0) == 1
    assert threads_for(8, 3.0) == 5


def test_busy_seconds_reads_the_cpu_line() -> None:
    line = f"cpu  {2 * TICK} {TICK} {TICK} {5 * TICK} {TICK} 0 0 {TICK} 0 0\ncpu0 9 9 9 9\n"
    assert busy_seconds(line) == (5.0, 11.0)  # user+nice+system+steal busy; idle+iowait not


def test_governor_follows_the_cpu_time_others_use(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    machine = Machine(tmp_path / "stat", monkeypatch)
    gov = ThreadGovernor(2, machine.path)
    assert gov.threads() == 2
    machine.run(0.5, own_cores=1.9, other_cores=0.05)  # alone: our spinning team is not "others"
    assert gov.threads() == 2
    machine.run(0.5, own_cores=1.0, other_cores=1.0)  # a busy loop starts
    assert gov.threads() == 1
    machine.run(0.5, own_cores=1.0, other_cores=1.0)
    assert gov.threads() == 1
    machine.run(0.2, own_cores=2.0, other_cores=0.0)  # a short pause of the other job is not enough...
    assert gov.threads() == 1
    for _ in range(6):  # ...but after a window of it the team grows back
        machine.run(0.2, own_cores=2.0, other_cores=0.0)
    assert gov.threads() == 2


def test_governor_without_proc_stat_keeps_every_core(tmp_path: Path) -> None:
    assert ThreadGovernor(2, tmp_path / "missing").threads() == 2


def test_configure_fixed_threads_win_over_adaptation(tmp_path: Path) -> None:
    threads.configure(1)
    assert torch.get_num_threads() == 1
    assert threads._governor is None and threads.adapt() == 1


def test_without_adaptation_the_team_is_fixed_at_the_available_cores() -> None:
    threads.configure(0)
    assert threads._governor is None and torch.get_num_threads() == available_cores()


def test_the_default_config_keeps_a_fixed_team() -> None:
    from harmonyrl.config import load_config

    assert not load_config().adapts_threads  # reproducible: the numerics depend on the team size
    assert load_config(None, ["adaptive_threads=true"]).adapts_threads
    assert not load_config(None, ["adaptive_threads=true", "threads=2"]).adapts_threads


def test_optimizer_step_adapts_the_team(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    threads.configure(0, adaptive=True)
    assert threads._governor is not None
    machine = Machine(tmp_path / "stat", monkeypatch)
    threads._governor = ThreadGovernor(2, machine.path)
    threads._governor.threads()
    machine.run(1.0, own_cores=1.0, other_cores=1.5)
    torch.set_num_threads(2)
    param = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([param], lr=0.1)
    param.sum().backward()
    opt.step()  # the global pre-hook looks at the (busy) machine before the step
    assert torch.get_num_threads() == 1
