"""The intra-op team size: cores from affinity and cgroup quota, free cores from the load, and the hooks."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from harmonyrl import threads
from harmonyrl.threads import (
    ThreadGovernor,
    available_cores,
    own_runnable,
    quota_cores,
    runnable_in_loadavg,
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


def test_governor_counts_only_threads_that_stay_runnable_for_the_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [0.0]
    monkeypatch.setattr(threads.time, "monotonic", lambda: clock[0])
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


def test_configure_fixed_threads_win_over_adaptation(tmp_path: Path) -> None:
    threads.configure(1)
    assert torch.get_num_threads() == 1
    assert threads._governor is None and threads.adapt() == 1


def test_without_adaptation_the_team_is_fixed_at_the_available_cores() -> None:
    threads.configure(0)  # adaptive_threads=false: the team never changes with the load
    assert threads._governor is None and torch.get_num_threads() == available_cores()


def test_optimizer_step_adapts_the_team(tmp_path: Path) -> None:
    threads.configure(0, adaptive=True)
    assert threads._governor is not None
    threads._governor = ThreadGovernor(2, loadavg(tmp_path / "loadavg", 50))
    torch.set_num_threads(2)
    param = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([param], lr=0.1)
    param.sum().backward()
    opt.step()  # the global pre-hook looks at the (busy) machine before the step
    assert torch.get_num_threads() == 1
