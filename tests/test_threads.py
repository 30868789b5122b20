"""The intra-op thread count: cores from affinity and cgroup quota, free cores from the load, and the hooks."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from harmonyrl import threads
from harmonyrl.threads import (
    ThreadGovernor,
    autogroup_nice,
    available_cores,
    competing_runnable,
    own_runnable,
    quota_cores,
    runnable_in_loadavg,
    state_and_nice,
    threads_for,
)


@pytest.fixture(autouse=True)
def restore_threads(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    before = torch.get_num_threads()
    monkeypatch.setattr(threads, "INTERVAL_S", 0.0)  # every call looks again
    yield
    threads._governor = None
    torch.set_num_threads(before)


def loadavg(path: Path, running: int) -> Path:
    path.write_text(f"0.52 0.58 0.59 {running}/467 12345\n")
    return path


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
    assert threads_for(2, 0) == 2
    assert threads_for(2, 1) == 1  # a busy loop takes one of two cores
    assert threads_for(2, 7) == 1
    assert threads_for(8, 3) == 5


def test_runnable_in_loadavg_and_own_runnable() -> None:
    assert runnable_in_loadavg("0.52 0.58 0.59 3/467 12345\n") == 3
    assert own_runnable() >= 1  # the thread asking is running


def fake_proc(root: Path, threads_by_pid: dict[int, list[tuple[str, int]]], groups: dict[int, int]) -> Path:
    """A ``/proc`` with, per pid, its threads' (state, nice) and its autogroup nice; this process included."""
    for pid, tasks in {**threads_by_pid, os.getpid(): [("R", 0), ("R", 0)]}.items():
        for tid, (state, nice) in enumerate(tasks):
            stat = root / str(pid) / "task" / str(pid + tid) / "stat"
            stat.parent.mkdir(parents=True, exist_ok=True)
            fields = [state, *["0"] * 15, str(nice), "1"]
            stat.write_text(f"{pid + tid} (python -c x) {' '.join(fields)}\n")
        (root / str(pid) / "autogroup").write_text(f"/autogroup-{pid} nice {groups.get(pid, 0)}\n")
    return root


def test_competing_threads_leave_out_lower_priority_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threads.os, "getpriority", lambda *_: 0)  # this run at nice 0, whatever runs the tests
    assert state_and_nice("42 (a (b) c) R 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 19 3") == ("R", 19)
    assert autogroup_nice("/autogroup-7 nice 19\n") == 19 and autogroup_nice(None) == 0
    proc = fake_proc(
        tmp_path,
        {
            10: [("R", 0)],  # a busy loop: competes
            20: [("R", 19), ("S", 0)],  # a niced job: yields to us
            30: [("R", 0), ("R", 0)],  # process nice 0, but in an autogroup at nice 19 (/work/wt/lowprio)
            40: [("S", 0)],  # asleep
        },
        groups={30: 19},
    )
    assert competing_runnable(proc) == 1  # and this process's own two threads are never counted
    monkeypatch.setattr(threads.os, "getpriority", lambda *_: 19)  # a run started with nice 19 (e.g. `nice pytest`)
    assert competing_runnable(proc) == 2  # a nice-19 job is its equal; the low-priority autogroup still is not


def test_governor_counts_only_threads_that_stay_runnable_for_the_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [0.0]
    monkeypatch.setattr(threads.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(threads, "competing_runnable", lambda proc: 99)  # every other thread competes
    path = loadavg(tmp_path / "loadavg", 1)  # only this thread runs: nobody else wants a core
    gov = ThreadGovernor(2, path)

    def look(at: float, running: int) -> int:
        clock[0] = at
        loadavg(path, running)
        return gov.threads()

    assert look(0.0, 1) == 2
    assert [look(0.5, 40), look(1.0, 40)] == [2, 2]  # busy since 0.5, but the idle look at 0.0 is < 1 s before
    assert look(1.6, 40) == 1  # seen at every look from 0.5 to 1.6: over a second, it counts
    assert look(1.7, 1) == 2  # one idle look and the team regrows at once
    assert [look(1.8, 40), look(2.0, 40), look(2.6, 40)] == [2, 2, 2]  # kernel workers, a shell command: ignored
    assert look(2.9, 40) == 1  # the idle look at 1.7 left the window: busy at every look since 1.8


def test_a_first_busy_look_or_a_niced_job_takes_no_core(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]
    monkeypatch.setattr(threads.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(threads.os, "getpriority", lambda *_: 0)  # this run at nice 0, whatever runs the tests
    path = loadavg(tmp_path / "loadavg", 40)  # busy from the first look
    proc = fake_proc(tmp_path / "proc", {10: [("R", 0)]}, {})
    gov = ThreadGovernor(2, path, proc)

    def look(at: float) -> int:
        clock[0] = at
        return gov.threads()

    assert [look(0.0), look(0.5)] == [2, 2]  # not yet seen for a whole window
    assert look(1.0) == 1  # now it has been
    gov = ThreadGovernor(2, path, fake_proc(tmp_path / "proc2", {10: [("R", 19)]}, {}))
    assert [look(2.0), look(3.0), look(4.0)] == [2, 2, 2]  # the load average counts it; the scan leaves it out


def test_configure_fixed_threads_win_over_adaptation(tmp_path: Path) -> None:
    threads.configure(1)
    assert torch.get_num_threads() == 1
    assert threads._governor is None and threads.adapt() == 1


def test_without_adaptation_the_team_is_fixed_at_the_available_cores() -> None:
    threads.configure(0)  # adaptive_threads=false: the team never changes with the load
    assert threads._governor is None and torch.get_num_threads() == available_cores()


def test_optimizer_step_adapts_the_team(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    threads.configure(0, adaptive=True)
    assert threads._governor is not None
    clock = [0.0]
    monkeypatch.setattr(threads.time, "monotonic", lambda: clock[0])
    busy = fake_proc(tmp_path / "proc", {10: [("R", 0)] * 48}, {})
    threads._governor = ThreadGovernor(2, loadavg(tmp_path / "loadavg", 50), busy)
    assert threads._governor.threads() == 2  # busy, but not yet for a whole window
    clock[0] = 1.0
    torch.set_num_threads(2)
    param = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([param], lr=0.1)
    param.sum().backward()
    opt.step()  # the global pre-hook looks at the (busy) machine before the step
    assert torch.get_num_threads() == 1
