"""The async pipeline in real ``harmonyrl train`` runs: the knob at 0 is today's run bit for bit; an async run
records each episode's policy version and replays bit for bit; killed with SIGKILL mid-RL and resumed, it ends
as an uninterrupted async run does (slow). The same with partial rollouts (``rl.async.partial``): each turn's
tokens record the version that sampled them, a partial step replays bit for bit, and a resume is lossless."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harmonyrl.config import load_config
from harmonyrl.harmony.tokenizer import HarmonyTokenizer
from harmonyrl.jobs.replay import replay_step
from harmonyrl.rl.partial import turn_version
from harmonyrl.rollout.store import read_step, step_path
from harmonyrl.run.checkpoint import save_checkpoint
from harmonyrl.run.setup import make_model, setup_process
from harmonyrl.types import Trajectory
from tiny_run import tiny_run

VOLATILE = ("time/", "rollout/tokens_per_s", "engine/")  # wall-clock and batching: depend on the machine
# every group kept and an entropy bonus: each step moves the weights, so "identical" is not trivially true
MOVING = ("threads=1", "rl.skip_zero_variance_groups=false", "rl.entropy_coef=0.01")
ASYNC = ("rl.async.max_staleness=1", "rl.correction.weights.mode=truncate")
# a warm start at which the nano model calls the tool: two-turn episodes, the second turn under a newer version
PARTIAL = (*ASYNC, "rl.async.partial=true", "sft.steps=100", "sft.lr=3e-3", "rollout.max_new_tokens=64")


def _turn_versions(traj: Trajectory) -> list[set[int]]:
    """The versions of each turn's sampled tokens (a turn's tokens are one run of the loss mask)."""
    turns: list[set[int]] = []
    for i, (m, v) in enumerate(zip(traj.loss_mask, traj.versions(), strict=True)):
        if m and (i == 0 or not traj.loss_mask[i - 1]):
            turns.append(set())
        if m:
            turns[-1].add(v)
    return turns


def _train(out: Path, name: str, *changes: str) -> Path:
    cmd = [sys.executable, "-m", "harmonyrl.cli", "train", *tiny_run(*changes), f"output_dir={out}", f"run_name={name}"]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "0"})
    assert done.returncode == 0, done.stdout + done.stderr
    return out / name


def _stable_rows(run: Path) -> list[dict[str, object]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rows]


def _untimed(trajectories: list[Trajectory]) -> list[Trajectory]:
    return [dataclasses.replace(t, turns=()) for t in trajectories]


def _weights(run: Path) -> bytes:
    return (run / "checkpoints" / "final" / "model.safetensors").read_bytes()


def test_max_staleness_zero_is_todays_run_bit_for_bit(tmp_path: Path) -> None:
    absent = _train(tmp_path, "absent", *MOVING)
    zero = _train(tmp_path, "zero", *MOVING, "rl.async.max_staleness=0")
    assert _stable_rows(zero) == _stable_rows(absent)
    assert _weights(zero) == _weights(absent)
    rl = [r for r in _stable_rows(zero) if r["phase"] == "rl"]
    assert [r["async/staleness_max"] for r in rl] == [0.0, 0.0]


def test_an_async_run_records_versions_and_replays_bit_for_bit(tmp_path: Path) -> None:
    run = _train(tmp_path, "k1", *MOVING, *ASYNC, "rl.steps=3")
    # step s (1-based) is sampled by version max(0, s - 2): 0, 0, 1; the trainer is at s - 1 then
    assert [{t.policy_version for t in read_step(step_path(run, s))} for s in (1, 2, 3)] == [{0}, {0}, {1}]
    rl = [r for r in _stable_rows(run) if r["phase"] == "rl"]
    assert [r["async/staleness_mean"] for r in rl] == [0.0, 1.0, 1.0]
    assert all(r["async/dropped"] == 0.0 for r in rl)
    assert all(r["async/engine_copies"] == 2.0 for r in rl)  # the batches ran on k + 1 embedded-engine copies
    replay_step(run, 1, save_to=tmp_path / "after_1")
    replay_step(run, 2, checkpoint=tmp_path / "after_1", save_to=tmp_path / "after_2")
    last = replay_step(run, 3, checkpoint=tmp_path / "after_2")
    assert last.compared_with == run / "checkpoints" / "final"
    assert last.identical is True
    assert last.metrics["train/skipped"] == 0.0


def test_a_partial_run_records_each_turns_version_and_replays_bit_for_bit(tmp_path: Path) -> None:
    run = _train(tmp_path, "partial", *MOVING, *PARTIAL, "rl.steps=3")
    spanning = 0
    for s in (1, 2, 3):  # step s (1-based) is batch s - 1: turn j sampled by version min(s - 1, max(0, s - 2) + j)
        for traj in read_step(step_path(run, s)):
            turns = _turn_versions(traj)
            assert turns == [{turn_version(s - 1, 1, j)} for j in range(len(turns))]
            spanning += bool(traj.token_versions)
    assert spanning > 0, "no episode had a second turn: the check above saw one version per episode only"
    rl = [r for r in _stable_rows(run) if r["phase"] == "rl"]
    assert all(r["async/stale_tokens"] == 0.0 and r["async/dropped"] == 0.0 for r in rl)
    episodes = [json.loads(line) for line in (run / "rollouts" / "episodes.jsonl").read_text().splitlines()]
    assert any(e.get("versions") == [1, 2] for e in episodes if e["step"] == 3)  # shown to people as well
    replay_step(run, 1, save_to=tmp_path / "after_1")
    replay_step(run, 2, checkpoint=tmp_path / "after_1", save_to=tmp_path / "after_2")
    last = replay_step(run, 3, checkpoint=tmp_path / "after_2")
    assert last.compared_with == run / "checkpoints" / "final"
    assert last.identical is True


def _teacher(folder: Path) -> Path:
    """A fresh micro model (the nano student's vocabulary) saved as a distillation teacher."""
    config = load_config(None, ["model.preset=micro", "seed=7"])
    setup_process(config.seed, 1)
    return save_checkpoint(folder, make_model(config, HarmonyTokenizer.load_default()), None, 0, {})


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["async", "partial", "partial_distill"])
def test_async_sigkill_then_resume_is_identical_to_an_uninterrupted_run(tmp_path: Path, mode: str) -> None:
    """``partial_distill``: partial rollouts, full-vocabulary on-policy distillation and a warm-up all on."""
    distill = (f"rl.distill.teacher={_teacher(tmp_path / 'teacher')}", "rl.distill.kind=full",
               "rl.lr_warmup_steps=3") if mode == "partial_distill" else ()  # fmt: skip
    changes = (*MOVING, *(ASYNC if mode == "async" else PARTIAL), *distill, "rl.steps=6", "rollout.group_size=4",
               "telemetry.record_rollouts=true")  # fmt: skip
    whole = _train(tmp_path, "whole", *changes)
    run = tmp_path / "cut"
    cmd = [
        sys.executable,
        "-m",
        "harmonyrl.cli",
        "train",
        *tiny_run(*changes),
        f"output_dir={tmp_path}",
        "run_name=cut",
    ]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    metrics = run / "metrics.jsonl"
    while (not metrics.is_file() or metrics.read_text().count('"phase": "rl"') < 3) and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)  # step 4's batch was collected ahead (k = 1) and is lost with the process
    proc.wait()
    assert not (run / "summary.json").exists(), "the run finished before it could be killed"
    resumed = subprocess.run([sys.executable, "-m", "harmonyrl.cli", "train", "--resume", str(run)], env=env,
                             capture_output=True, text=True)  # fmt: skip
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resuming after rl step" in resumed.stdout
    assert _stable_rows(run) == _stable_rows(whole)
    assert _weights(run) == _weights(whole)
    episodes = (run / "rollouts" / "episodes.jsonl").read_text()
    assert episodes == (whole / "rollouts" / "episodes.jsonl").read_text()
    for step in range(1, 7):  # token streams, log-probs and versions; the turns' wall-clock timings differ
        assert _untimed(read_step(step_path(run, step))) == _untimed(read_step(step_path(whole, step)))
