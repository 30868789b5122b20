"""docs/custom-env.md cannot rot: every ``harmonyrl`` command in its ``bash`` blocks runs as written, in order,
through the CLI (a train or eval gets test-size settings appended), and every ``yaml`` block is a valid config."""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from harmonyrl.cli import app
from harmonyrl.config import load_config

ROOT = Path(__file__).parents[2]
DOC = ROOT / "docs" / "custom-env.md"
SMALL_TRAIN = [
    "model.preset=nano", "sft.steps=3", "sft.batch_size=4", "rl.steps=2", "rollout.tasks_per_step=2",
    "rollout.group_size=2", "rollout.max_new_tokens=24", "eval.n_tasks=3", "eval.samples_per_task=1",
]  # fmt: skip
"""Appended to the tutorial's ``train`` (later overrides win): a nano model, 3 SFT steps, 2 RL steps."""
SMALL_EVAL = ["eval.n_tasks=3", "eval.samples_per_task=1"]

runner = CliRunner()


def blocks(language: str) -> list[str]:
    """The fenced code blocks of the tutorial in ``language``."""
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), flags=re.S)


def commands() -> list[list[str]]:
    """The ``harmonyrl`` commands of the ``bash`` blocks, as argument lists (line continuations joined)."""
    found = []
    for block in blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words and words[0] == "harmonyrl":
                found.append(words[1:])
    return found


def _small(args: list[str]) -> list[str]:
    if args[0] == "train" and "--resume" not in args:
        return args + SMALL_TRAIN
    return args + SMALL_EVAL if args[0] == "eval" else args


def test_the_tutorial_lists_the_whole_journey() -> None:
    assert [c[0] for c in commands()] == ["check-env", "train", "eval", "show", "report", "train"]
    assert "--resume" in commands()[-1]


def test_every_yaml_block_is_a_valid_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    monkeypatch.chdir(tmp_path)
    for i, block in enumerate(blocks("yaml")):
        (tmp_path / f"{i}.yaml").write_text(block)
        cfg = load_config(tmp_path / f"{i}.yaml")
        assert cfg.env.name == yaml.safe_load(block)["env"]["name"] == "custom"


def test_the_tutorial_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    monkeypatch.chdir(tmp_path)
    outputs = []
    for args in commands():
        result = runner.invoke(app, _small(args))
        assert result.exit_code == 0, (args, result.output)
        assert "Traceback" not in result.output
        outputs.append(" ".join(result.output.split()))  # the console wraps long paths
    check, train, evaluated, show, report, resume = outputs
    assert "report/index.html" in report
    assert "environment contract OK" in check
    assert "env units" in train and "held-out pass@1:" in train
    assert "evaluating env 'units'" in evaluated and '"eval/success"' in evaluated  # named as train names it
    assert "task units-" in show
    assert (tmp_path / "runs" / "units" / "report" / "index.html").is_file()
    assert "resuming after rl step 2" in resume
    recorded = load_config(tmp_path / "runs" / "units" / "config.yaml")
    assert recorded.env.model_dump() == {
        "name": "custom",
        "factory": f"{tmp_path / 'examples' / 'unit_env.py'}:UnitFactory",
        "kwargs": {"max_value": 1000},
        "memory": False,
        "order": "hashed",
    }

    elsewhere = tmp_path / "elsewhere"  # the recorded absolute paths rebuild the env from any folder
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    result = runner.invoke(app, ["train", "--resume", str(tmp_path / "runs" / "units")])
    assert result.exit_code == 0 and "resuming after rl step 2" in " ".join(result.output.split()), result.output
