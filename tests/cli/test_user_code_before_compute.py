"""User code that is not what the run needs is ``check-env``'s one-line rule, at ``train`` too, before any model is
built or step run (issue 44 item 4): a factory that is no ``EnvFactory`` at all (``class F: pass``), an env whose
``make`` returns something without the ``Env`` methods, an expert with the wrong signature, a tool whose schema is
not JSON-serialisable or cannot be derived. Each: exit code 2, one line, no traceback, no run folder left behind."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harmonyrl.cli import app

EXAMPLE = Path(__file__).parents[2] / "examples" / "unit_env.py"
RUN = ["model.preset=nano", "run_name=r", "rl.steps=1", "env.name=custom"]

USER_CODE = '''
from collections.abc import Callable

from units import UnitFactory
from harmonyrl.envs.tools import Tool, Toolbox
from harmonyrl.types import ToolSpec


class F:
    pass


def nothing():
    return None


class NoEnv(UnitFactory):
    def make(self, task):
        return object()


class SetInSchema(UnitFactory):
    def make(self, task):
        env = super().make(task)
        env.tools = [ToolSpec("odd", "Odd.", {"type": "object", "properties": {"x": {"default": {1, 2}}}})]
        return env


def hook(cb: Callable[[int], int]) -> str:
    """Call back.

    Args:
        cb: A function.
    """
    return "x"


class CallableArg(UnitFactory):
    def __init__(self):
        super().__init__()
        self.box = Toolbox([Tool.from_function(hook)])


def one_arg(task):
    return []


def keyword_only(*, task, rng):
    return []
'''

runner = CliRunner()


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    shutil.copy(EXAMPLE, tmp_path / "units.py")
    (tmp_path / "mine.py").write_text(textwrap.dedent(USER_CODE))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _one_line(args: list[str], here: Path, code: int) -> str:
    result = runner.invoke(app, args)
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit | None)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert not (here / "runs").exists()  # nothing computed, no run folder left behind
    return lines[0]


FACTORY_RULES = [
    ("mine.py:F", "protocol: the factory is a F, which lacks name, tasks, make: an EnvFactory needs name (a str), "
                  "tasks(split) and make(task) (docs/custom-env.md)"),
    ("mine.py:nothing", "protocol: the factory is a NoneType, which lacks name, tasks, make"),
    ("mine.py:NoEnv", "protocol [units-"),
    ("mine.py:SetInSchema", "tool 'odd': schema is not JSON-serialisable (Object of type set is not JSON "
                            "serializable)"),
    ("mine.py:CallableArg", "tools: tool 'hook': parameter 'cb': type 'Callable' has no JSON schema"),
]  # fmt: skip


@pytest.mark.parametrize(("target", "rule"), FACTORY_RULES)
def test_a_factory_that_breaks_the_contract_is_check_envs_rule_at_train_too(here: Path, target: str, rule: str) -> None:
    checked = runner.invoke(app, ["check-env", target, "--tasks", "1"])
    assert checked.exit_code == 1 and "Traceback" not in checked.output, checked.output
    assert any(line.startswith("✗ ") and rule in line for line in checked.output.splitlines()), checked.output
    message = _one_line(["train", *RUN, f"env.factory={target}", "sft.steps=0"], here, 2)
    assert message.startswith(f"error: env.factory '{here / target}' fails check_env: "), message
    assert rule in message


def test_a_broken_env_is_named_with_its_tasks_not_eaten_as_markup(here: Path) -> None:
    """Regression: the one-line error was printed as rich markup, so ``[units-1 and 5 more tasks]`` vanished
    from it ("episode : tool 'odd' ...")."""
    message = _one_line(["train", *RUN, "env.factory=mine.py:SetInSchema", "sft.steps=0"], here, 2)
    assert "fails check_env: episode [units-" in message and "more tasks]: tool 'odd'" in message


@pytest.mark.parametrize("expert", ["one_arg", "keyword_only"])
def test_an_expert_with_the_wrong_signature_stops_before_any_compute(here: Path, expert: str) -> None:
    args = ["train", *RUN, "env.factory=units.py:UnitFactory", "sft.steps=2", f"sft.expert=mine.py:{expert}"]
    message = _one_line(args, here, 2)
    assert message.startswith(f"error: sft.expert '{here}/mine.py:{expert}' must take (task, rng): "), message


def test_the_memory_wrapper_does_not_read_a_broken_factory_first(here: Path) -> None:
    """``env.memory`` and ``env.order=given`` wrap or read the factory: the rule still comes first."""
    args = ["train", *RUN, "env.factory=mine.py:F", "env.memory=true", "env.order=given", "sft.steps=0"]
    assert "fails check_env: protocol: the factory is a F" in _one_line(args, here, 2)
