"""The user's own env and expert through the CLI: every mistake is one line, exit code 2, before any compute and
before the run folder exists, for each command that builds the env (train, sft, eval)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harmonyrl.cli import app

EXAMPLE = Path(__file__).parents[2] / "examples" / "unit_env.py"
ENV = ["env.name=custom", "env.factory=units.py:UnitFactory", "env.kwargs.max_value=3"]
SMALL = ["model.preset=nano", "run_name=r", "sft.steps=2", "rl.steps=1"]

runner = CliRunner()


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    shutil.copy(EXAMPLE, tmp_path / "units.py")
    (tmp_path / "broken.py").write_text(
        "from units import UnitFactory\n\n"
        "class NoTests(UnitFactory):\n"
        "    def tasks(self, split):\n"
        "        return [] if split == 'test' else super().tasks(split)\n\n"
        "not_a_function = 3\n"
    )
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _one_line_error(args: list[str], here: Path) -> str:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert "Traceback" not in result.output
    assert not (here / "runs").exists()  # nothing computed, no run folder left behind
    return " ".join(lines)


@pytest.mark.parametrize("command", ["train", "sft"])
@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (["env.factory=my_pkg.tasks:make"], "env.factory 'my_pkg.tasks:make': module 'my_pkg' not found"),
        (["env.factory=broken.py:NoTests"], "broken.py:NoTests' fails check_env: splits: test split is empty"),
        (["env.kwargs.difficulty=3"], "env.kwargs.difficulty: env.factory"),
        (["sft.expert=units_expert:fn"], "sft.expert 'units_expert:fn': module 'units_expert' not found"),
        (["sft.expert=broken.py:not_a_function"], "broken.py:not_a_function' is a int, not a callable"),
    ],
)
def test_a_broken_custom_env_or_expert_stops_before_any_compute(
    here: Path, command: str, change: list[str], expected: str
) -> None:
    message = _one_line_error([command, *ENV, "sft.expert=units.py:expert", *SMALL, *change], here)
    assert message.startswith("error: ") and expected in message


def test_no_expert_is_an_error_naming_the_three_ways(here: Path) -> None:
    message = _one_line_error(["train", *ENV, *SMALL], here)
    assert "give sft.expert=module:fn (or file.py:fn), demonstrations (sft.demos=FILE), or sft.steps=0" in message


def test_eval_checks_the_env_too(here: Path) -> None:
    (here / "ckpt").mkdir()
    (here / "ckpt" / "config.json").write_text("{}")  # no record: evaluated on the configured env
    message = _one_line_error(["eval", "--checkpoint", "ckpt", *ENV[:1], "env.factory=broken.py:NoTests"], here)
    assert "fails check_env: splits: test split is empty" in message


def test_check_env_names_the_target_of_an_import_error(here: Path) -> None:
    result = runner.invoke(app, ["check-env", "my_pkg.tasks:make"])
    assert result.exit_code == 2
    assert result.output.strip() == (
        "error: my_pkg.tasks:make: module 'my_pkg' not found (looked in the working directory and sys.path)"
    )
