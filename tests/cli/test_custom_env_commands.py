"""The commands the tutorial does not walk through, on a custom env: ``sft`` then ``train model.init_from``,
``compare`` (its shared warm start and an RL run), ``replay --rescore`` (the env rebuilt from the run's record),
and ``eval`` with an explicit ``env.kwargs`` that differs from the record (refused, naming the key)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harmonyrl.cli import app

EXAMPLE = Path(__file__).parents[2] / "examples" / "unit_env.py"
ENV = ["env.name=custom", "env.factory=units.py:UnitFactory", "env.kwargs.max_value=4", "sft.expert=units.py:expert"]
SMALL = [
    "model.preset=nano", "sft.steps=2", "sft.batch_size=4", "rl.steps=1", "rollout.tasks_per_step=2",
    "rollout.group_size=2", "rollout.max_new_tokens=24", "eval.n_tasks=2", "eval.samples_per_task=1",
]  # fmt: skip

runner = CliRunner()


def _ok(args: list[str]) -> str:
    result = runner.invoke(app, args)
    assert result.exit_code == 0, (args, result.output)
    return " ".join(result.output.split())


def test_sft_compare_replay_and_eval_on_a_custom_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shutil.copy(EXAMPLE, tmp_path / "units.py")
    monkeypatch.chdir(tmp_path)
    _ok(["sft", *ENV, *SMALL, "run_name=warm"])
    warm = tmp_path / "runs" / "warm" / "checkpoints" / "sft"
    rl_only = [s for s in SMALL if not s.startswith("sft.steps=")]  # model.init_from is the warm start
    out = _ok(["train", *ENV, *rl_only, "run_name=rl", f"model.init_from={warm}"])
    assert "SFT warm start: none, model.init_from=" in out and "held-out pass@1:" in out

    _ok(["compare", "--algos", "grpo", "--out", "cmp", *ENV, *SMALL])
    assert (tmp_path / "cmp" / "compare.md").is_file() and (tmp_path / "cmp" / "grpo-seed0" / "summary.json").is_file()

    replayed = _ok(["replay", "runs/rl", "--step", "1", "--rescore"])
    assert "re-scored 4 episodes" in replayed

    result = runner.invoke(
        app, ["eval", "--checkpoint", "runs/rl/checkpoints/final", "env.name=custom", "env.kwargs.max_value=5"]
    )
    assert result.exit_code == 2
    assert "env.kwargs.max_value=5, trained with 4" in " ".join(result.output.split())
