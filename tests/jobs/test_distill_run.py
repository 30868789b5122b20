"""On-policy distillation in a real ``harmonyrl train`` run: the teacher's term reaches the update and its
metrics, a run killed mid-RL and resumed equals the uninterrupted one, every step replays bit-exactly, and a
teacher with another vocabulary is refused in one line before any work."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harmonyrl.cli import app
from harmonyrl.config import load_config
from harmonyrl.harmony.tokenizer import HarmonyTokenizer
from harmonyrl.jobs.replay import replay_step
from harmonyrl.run.checkpoint import save_checkpoint
from harmonyrl.run.setup import make_model, setup_process
from kill_resume import ENV, cli, killed_and_resumed, metric_rows, same_episodes
from tiny_run import tiny_run


@pytest.fixture(scope="module")
def teacher(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh micro model (wider and deeper than the nano student), same vocabulary."""
    folder = tmp_path_factory.mktemp("teacher") / "ckpt"
    config = load_config(None, ["model.preset=micro", "seed=7"])
    setup_process(config.seed, 1)
    save_checkpoint(folder, make_model(config, HarmonyTokenizer.load_default()), None, 0, {})
    return folder


def _run(teacher: Path, *extra: str) -> list[str]:
    return tiny_run("sft.steps=4", "rl.steps=4", "rollout.group_size=4", "threads=1",
                    f"rl.distill.teacher={teacher}", "rl.distill.weight=0.5", *extra)  # fmt: skip


@pytest.fixture(scope="module")
def whole(teacher: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("runs")
    done = subprocess.run(cli("train", *_run(teacher), f"output_dir={out}", "run_name=whole"), env=ENV,
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return out / "whole"


def test_the_teacher_term_reaches_every_step(whole: Path) -> None:
    rl = [r for r in metric_rows(whole) if r["phase"] == "rl"]
    assert len(rl) == 4
    for r in rl:
        # a fresh teacher disagrees with the student: a positive reverse KL, measured on every sampled token
        assert isinstance(r["distill/reverse_kl"], float) and r["distill/reverse_kl"] > 0
        assert r["train/dropped_zero_var"] == 0.0  # equal-reward groups still carry the teacher's term
        assert r["train/skipped"] == 0.0


def test_a_killed_and_resumed_distill_run_equals_the_uninterrupted_one(teacher: Path, whole: Path) -> None:
    out = whole.parent
    killed_and_resumed([*_run(teacher), f"output_dir={out}", "run_name=cut"], out / "cut", timeout_s=120)
    assert metric_rows(out / "cut") == metric_rows(whole)
    assert same_episodes(out / "cut", whole)


def test_every_distill_step_replays_bit_exactly(whole: Path) -> None:
    last = replay_step(whole, 4)  # steps 1-3 chained from their episodes, then 4 against checkpoints/final
    assert (last.chained, last.identical, last.matches_metrics) == (3, True, True)
    assert "distill/reverse_kl" in last.metrics


def test_a_full_distill_run_logs_its_term_and_replays_bit_exactly(teacher: Path, tmp_path: Path) -> None:
    done = subprocess.run(cli("train", *_run(teacher, "rl.distill.kind=full"), f"output_dir={tmp_path}",
                               "run_name=full"), env=ENV, capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    rl = [r for r in metric_rows(tmp_path / "full") if r["phase"] == "rl"]
    assert len(rl) == 4
    for r in rl:  # the loss term's exact reverse KL beside the sampled-id estimate, on every step
        assert isinstance(r["distill/full_reverse_kl"], float) and r["distill/full_reverse_kl"] > 0
        assert isinstance(r["distill/reverse_kl"], float)
    last = replay_step(tmp_path / "full", 4)
    assert (last.chained, last.identical, last.matches_metrics) == (3, True, True)


def test_a_teacher_with_another_vocabulary_is_one_line(teacher: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["train", *_run(teacher, "model.tokenizer=o200k_harmony"), f"output_dir={tmp_path}"]
    )
    assert result.exit_code == 2 and result.output.strip().count("\n") == 0
    assert "has vocab 1024" in result.output and "must share the student's tokenizer" in result.output
    assert not any(tmp_path.iterdir())  # refused before any work
