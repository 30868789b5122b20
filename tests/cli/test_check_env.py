"""`harmonyrl check-env` on user code: imports as `python -m` would; every finding is a line, not a traceback."""

from __future__ import annotations

import shutil
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harmonyrl.cli import app
from harmonyrl.envs.checker import errors
from harmonyrl.envs.tools import Tool, ToolSchemaError

runner = CliRunner()
EXAMPLE = Path(__file__).parents[2] / "examples" / "unit_env.py"


def _user_file(tmp_path: Path, body: str) -> str:
    """A user's env module beside a copy of the example (imported as a sibling, as ``python file.py`` allows)."""
    shutil.copy(EXAMPLE, tmp_path / "unit_env.py")
    (tmp_path / "mine.py").write_text("from unit_env import UnitEnv, UnitFactory, convert\n" + textwrap.dedent(body))
    return f"{tmp_path / 'mine.py'}:F"


def _lines(output: str) -> list[str]:
    assert "Traceback" not in output, output
    return [line for line in output.splitlines() if line.strip()]


def test_module_form_imports_from_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "userpkg").mkdir()
    (tmp_path / "userpkg" / "__init__.py").write_text("")
    shutil.copy(EXAMPLE, tmp_path / "userpkg" / "units.py")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])  # no PYTHONPATH=.
    result = runner.invoke(app, ["check-env", "userpkg.units:UnitFactory", "--tasks", "2"])
    assert result.exit_code == 0, result.output
    assert _lines(result.output) == [
        "· convert: 10 calls with wrong arguments → 10 error observations (KeyError ×7, invalid arguments ×2, "
        "invalid JSON ×1); none masked",
        "· validation: none of its own (tasks('validation') is empty); a run carves 64 of the 712 train tasks (a hash "
        "of each prompt) as its validation split, training on the other 648 (docs/custom-env.md)",
        "✓ userpkg.units:UnitFactory: environment contract OK (2 of 712 train tasks and 1 test task driven)",
    ]


def test_untyped_tool_parameter_is_one_line_naming_tool_and_parameter(tmp_path: Path) -> None:
    target = _user_file(
        tmp_path,
        """
        from harmonyrl.envs.tools import Tool, Toolbox

        def scale(value, factor: float) -> str:
            '''Scale a number.'''
            return str(value * factor)

        class F(UnitFactory):
            def __init__(self) -> None:
                super().__init__()
                self.box = Toolbox([Tool.from_function(scale)])
        """,
    )
    result = runner.invoke(app, ["check-env", target])
    assert result.exit_code == 1
    assert _lines(result.output) == [
        "✗ tools: tool 'scale': parameter 'value' needs a type annotation (its JSON schema comes from it)"
    ]


class Point:
    pass


def test_a_parameter_type_without_json_schema_names_the_parameter() -> None:
    def where(p: Point, label: str) -> str:
        """Locate."""
        return label

    with pytest.raises(ToolSchemaError, match="tool 'where': parameter 'p': type 'Point' has no JSON schema"):
        Tool.from_function(where)

    def nowhere(p: Nowhere) -> str:  # type: ignore[name-defined]  # noqa: F821
        """Locate."""
        return ""

    with pytest.raises(ToolSchemaError, match="tool 'nowhere': cannot resolve its type annotations"):
        Tool.from_function(nowhere)


def test_sync_step_says_async_once_and_a_tool_without_docstring_warns(tmp_path: Path) -> None:
    target = _user_file(
        tmp_path,
        """
        from harmonyrl.envs.tools import Tool, Toolbox
        from harmonyrl.types import StepResult

        def twice(value: float) -> str:
            return str(2 * value)

        class SyncEnv(UnitEnv):
            def step(self, action):
                return StepResult(reward=0.0, terminated=True)

        class F(UnitFactory):
            def __init__(self) -> None:
                super().__init__()
                self.box = Toolbox([Tool.from_function(twice)])

            def make(self, task):
                return SyncEnv(task, self.box)
        """,
    )
    result = runner.invoke(app, ["check-env", target, "--tasks", "3"])
    assert result.exit_code == 1
    # 3 train tasks + 1 test task share each finding: one line each, the task ids in brackets kept (not markup)
    assert _lines(result.output) == [
        "✗ episode [units-1 and 3 more tasks]: step() must be `async def` (the rollout awaits it)",
        "! tools [units-1 and 3 more tasks]: tool 'twice' has no description (no docstring): the model sees only "
        "its name",
        "! tools [units-1 and 3 more tasks]: tool 'twice': parameter(s) 'value' have no description (add an Args: "
        "section)",
        "· validation: none of its own (tasks('validation') is empty); a run carves 64 of the 712 train tasks (a hash "
        "of each prompt) as its validation split, training on the other 648 (docs/custom-env.md)",
    ]


def test_warnings_alone_pass(tmp_path: Path) -> None:
    target = _user_file(
        tmp_path,
        """
        from harmonyrl.envs.tools import Tool, Toolbox

        def convert(value: float, unit: str, to: str) -> str:
            from unit_env import FACTORS
            return f"{value * FACTORS[unit] / FACTORS[to]:.2f}"

        class F(UnitFactory):
            def __init__(self) -> None:
                super().__init__()
                self.box = Toolbox([Tool.from_function(convert)])
        """,
    )
    result = runner.invoke(app, ["check-env", target, "--tasks", "2"])
    assert result.exit_code == 0, result.output
    lines = _lines(result.output)
    assert len(lines) == 5 and lines[0].startswith("! tools [units-1 and 2 more tasks]: tool 'convert' has no")
    assert lines[2].startswith("· convert: 10 calls with wrong arguments")
    assert lines[3].startswith("· validation: none of its own (tasks('validation') is empty); a run carves 64 of")
    assert lines[-1] == f"✓ {target}: environment contract OK (2 of 712 train tasks and 1 test task driven, 2 warnings)"


def test_the_users_own_exception_while_building_is_a_line_with_its_place(tmp_path: Path) -> None:
    target = _user_file(
        tmp_path,
        """
        class F(UnitFactory):
            def __init__(self) -> None:
                raise RuntimeError("database not found")
        """,
    )
    result = runner.invoke(app, ["check-env", target])
    assert result.exit_code == 1
    (line,) = _lines(result.output)
    assert line.startswith(f"✗ load: building {target} raised RuntimeError: database not found (")
    assert line.endswith("mine.py:5)")


def test_dedupe_counts_other_tasks() -> None:
    from harmonyrl.envs.checker import CheckIssue, dedupe

    issues = [CheckIssue("episode", "x", "a"), CheckIssue("episode", "y", "a"), CheckIssue("episode", "x", "b")]
    assert [str(i) for i in dedupe(issues)] == ["episode [a and 1 more task]: x", "episode [a]: y"]
    assert errors([CheckIssue("tools", "w", None, "warning")]) == []


def test_factory_arguments_are_given_as_a_run_gives_env_kwargs() -> None:
    result = runner.invoke(app, ["check-env", f"{EXAMPLE}:UnitFactory", "max_value=1000", "--tasks", "2"])
    assert result.exit_code == 0, result.output
    assert _lines(result.output)[-1].endswith("(2 of 7192 train tasks and 1 test task driven)")  # the 1000 arrived
    spelled = runner.invoke(app, ["check-env", f"{EXAMPLE}:UnitFactory", "env.kwargs.nope=3"])
    assert spelled.exit_code == 1 and "unexpected keyword argument 'nope'" in spelled.output
    bad = runner.invoke(app, ["check-env", f"{EXAMPLE}:UnitFactory", "junk"])
    assert bad.exit_code == 2 and _lines(bad.output) == [
        f"error: {EXAMPLE}:UnitFactory: override 'junk' is not of the form key=value"
    ]
