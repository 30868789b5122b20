"""``harmonyrl train`` under ``torchrun --nproc_per_node 2``: rank 0 alone writes, a SIGKILL mid-RL loses
nothing, and a run saved by 2 processes resumes in 1 (DCP reshards the optimizer).

Slow (several tiny runs of 2 processes): behind the ``slow`` marker, which CI runs (``.ci/run``: ``pytest -m slow``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tiny_run import tiny_run

TINY = tiny_run(
    "sft.steps=12",
    "sft.checkpoint_every=5",
    "rl.steps=6",
    "rollout.group_size=4",
    "eval.samples_per_task=2",
    "threads=1",
    # a nano model earns no reward this early: without the entropy bonus every update would be skipped as
    # nothing trainable, and the test would resume nothing but the rollouts
    "rl.skip_zero_variance_groups=false",
    "rl.entropy_coef=0.01",
)
VOLATILE = ("time/", "rollout/tokens_per_s", "engine/")  # wall-clock and batching: depend on the machine
TIMEOUT_S = 900


def _env() -> dict[str, str]:
    src = Path(__file__).resolve().parents[2] / "src"
    path = os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}


def _launch(processes: int, *args: str) -> list[str]:
    if processes == 1:
        return [sys.executable, "-m", "harmonyrl.cli", *args]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes), "-m",
            "harmonyrl.cli", *args]  # fmt: skip


def _rows(run: Path) -> list[dict[str, object]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rows]


def _rl_rows(run: Path) -> int:
    path = run / "metrics.jsonl"
    return path.read_text().count('"phase": "rl"') if path.is_file() else 0


@pytest.fixture(scope="module")
def whole(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("whole")
    done = subprocess.run(_launch(2, "train", *TINY, f"output_dir={out}", "run_name=whole"), env=_env(),
                          capture_output=True, text=True, timeout=TIMEOUT_S)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    return out / "whole"


def _killed_mid_rl(tmp_path: Path) -> Path:
    run = tmp_path / "cut"
    proc = subprocess.Popen(_launch(2, "train", *TINY, f"output_dir={tmp_path}", "run_name=cut"), env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + TIMEOUT_S
    while _rl_rows(run) < 3 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)  # torchrun and both ranks, at once
    proc.wait()
    assert not (run / "summary.json").exists(), "the run finished before it could be killed"
    return run


@pytest.mark.slow
def test_rank_zero_alone_writes_the_run(whole: Path) -> None:
    kinds = {json.loads(line)["phase"] for line in (whole / "metrics.jsonl").read_text().splitlines()}
    assert kinds == {"sft", "eval", "rl"}
    rl = [r for r in _rows(whole) if r["phase"] == "rl"]
    assert [r["step"] for r in rl] == [1, 2, 3, 4, 5, 6]  # one row per step: not one per rank
    assert all(r["train/skipped"] == 0.0 for r in rl)  # every step trained and synced the engine
    episodes = (whole / "rollouts" / "episodes.jsonl").read_text().splitlines()
    assert len(episodes) == 6 * 2 * 4  # steps × tasks × group
    final = whole / "checkpoints" / "final"
    assert sorted(p.name for p in (final / "sharded").iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert (final / "model.safetensors").is_file() and json.loads((whole / "summary.json").read_text())
    assert not list(whole.glob("**/*.tmp")) and not (whole / "error.log").exists()


@pytest.mark.slow
def test_sigkill_then_resume_is_identical_to_an_uninterrupted_run(whole: Path, tmp_path: Path) -> None:
    run = _killed_mid_rl(tmp_path)
    resumed = subprocess.run(_launch(2, "train", "--resume", str(run)), env=_env(), capture_output=True, text=True,
                             timeout=TIMEOUT_S)  # fmt: skip
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr[-3000:]
    assert "resuming after rl step" in resumed.stdout
    assert _rows(run) == _rows(whole)
    assert (run / "rollouts" / "episodes.jsonl").read_text() == (whole / "rollouts" / "episodes.jsonl").read_text()
    mine, theirs = (load_file(r / "checkpoints" / "final" / "model.safetensors") for r in (run, whole))
    assert all(bool((mine[k] == theirs[k]).all()) for k in theirs)


@pytest.mark.slow
def test_a_two_process_run_resumes_in_one_process(whole: Path, tmp_path: Path) -> None:
    run = _killed_mid_rl(tmp_path)
    resumed = subprocess.run(_launch(1, "train", "--resume", str(run)), env=_env(), capture_output=True, text=True,
                             timeout=TIMEOUT_S)  # fmt: skip
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr[-3000:]
    assert "resuming after rl step" in resumed.stdout
    # the same steps, each within fp32 rounding of the 2-process run's: the optimizer state came back resharded
    # (lost Adam moments would change every later update by far more than this)
    mine = [r for r in _rows(run) if r["phase"] == "rl"]
    theirs = [r for r in _rows(whole) if r["phase"] == "rl"]
    assert [r["step"] for r in mine] == [r["step"] for r in theirs]
    assert all(r["train/skipped"] == 0.0 for r in theirs), "every step must train to show anything"
    for a, b in zip(mine, theirs, strict=True):
        assert a["train/skipped"] == b["train/skipped"] and a["rollout/reward"] == b["rollout/reward"]
        for key in ("train/loss", "train/grad_norm"):  # absent from a step with nothing trainable
            assert a.get(key) == pytest.approx(b.get(key), rel=1e-4, abs=1e-6), (a["step"], key)
