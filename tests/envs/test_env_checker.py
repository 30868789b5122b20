"""check_env passes on the calculator and catches contract violations in broken environments."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Sequence
from typing import Literal

import pytest

from harmonyrl.envs.checker import acheck_report, assert_env_ok, check_env, errors, wrong_arguments
from harmonyrl.envs.tools import Tool, Toolbox, ToolInfraError, tool
from harmonyrl.tasks.calculator import CalculatorEnv, CalculatorFactory
from harmonyrl.types import Message, StepResult, Task


def small() -> CalculatorFactory:
    return CalculatorFactory(seed=0, n_train=100, n_test=20)


def test_calculator_passes() -> None:
    assert check_env(small(), n_tasks=5, rebuild=small) == []
    assert_env_ok(small())


class BrokenEnv(CalculatorEnv):
    """Finals never terminate and tool calls crash the env."""

    async def step(self, action: Sequence[Message]) -> StepResult:
        if action and action[-1].is_tool_call:
            raise KeyError("tool")
        return StepResult(reward=2.0, terminated=True, truncated=True, info={"correct": 1})  # type: ignore[dict-item]


class BrokenFactory(CalculatorFactory):
    def tasks(self, split: Literal["train", "test"]) -> Sequence[Task]:
        tasks = super().tasks(split)
        return [*tasks, super().tasks("train")[0]] if split == "test" else tasks  # a leaked train task

    def make(self, task: Task) -> CalculatorEnv:
        return BrokenEnv(task, self._toolbox)


def test_broken_env_is_reported() -> None:
    issues = check_env(BrokenFactory(n_train=10, n_test=5), n_tasks=1, rebuild=lambda: small())
    text = "\n".join(map(str, issues))
    for needle in (
        "Task.split",
        "ids are not unique",
        "prompts appear in both",
        "different tasks",
        "both set",
        "outside [0, 1]",
        "info values must be floats",
        "raised KeyError",
    ):
        assert needle in text, needle
    with pytest.raises(AssertionError, match="env check failed"):
        assert_env_ok(BrokenFactory(n_train=10, n_test=5))


def _builtin_env_configs() -> list[object]:
    """One default config per member of the ``EnvConfig`` union: a new env is covered without editing this
    (``custom``, the user's own, with the tutorial's example)."""
    from pathlib import Path
    from typing import get_args

    from harmonyrl.tasks.config import EXTERNAL_ENVS, CustomEnvConfig, EnvConfig

    example = CustomEnvConfig(factory=f"{Path(__file__).parents[2] / 'examples' / 'unit_env.py'}:UnitFactory")
    members = [c for c in get_args(get_args(EnvConfig)[0]) if c.model_fields["name"].default not in EXTERNAL_ENVS]
    return [example if cls is CustomEnvConfig else cls() for cls in members]  # external: tests/tasks/ecosystems/


@pytest.mark.parametrize("env_cfg", _builtin_env_configs(), ids=lambda c: c.name)  # type: ignore[attr-defined]
def test_every_builtin_env_passes_check_env_from_its_default_config(env_cfg: object) -> None:
    """Through the same path ``harmonyrl train`` takes (config → make_factory), memory wrapper included."""
    from harmonyrl.tasks.factory import make_factory

    if env_cfg.name in ("retool", "humaneval"):  # type: ignore[attr-defined]
        from harmonyrl.sandbox import SandboxUnavailable, check_sandbox

        try:
            check_sandbox()
        except SandboxUnavailable as e:
            pytest.skip(f"bubblewrap cannot run here: {e}")
    for cfg in (env_cfg, env_cfg.model_copy(update={"memory": True})):  # type: ignore[attr-defined]
        assert check_env(make_factory(cfg, seed=0), n_tasks=2, rebuild=lambda c=cfg: make_factory(c, seed=0)) == []


# ---- wrong arguments: where each tool call lands --------------------------------------------------------


def lookup(key: str, scale: float = 1.0) -> str:
    """Look a key up.

    Args:
        key: A key.
        scale: A factor.
    """
    return str({"a": 1.0}[key] * scale)


def declares(key: str) -> str:
    """Declares every bad key an infrastructure failure: a button a policy would find.

    Args:
        key: A key.
    """
    raise ToolInfraError(f"no {key}")


class OwnDispatchEnv(CalculatorEnv):
    """Runs ``lookup`` itself, letting its exception out of ``step``."""

    async def step(self, action: Sequence[Message]) -> StepResult:
        last = action[-1]
        if last.is_tool_call:
            return StepResult(observations=(Message("tool", lookup(**json.loads(last.content))),))
        return await super().step(action)


class ToolsFactory(CalculatorFactory):
    def __init__(self, *tools: Tool, env: type[CalculatorEnv] = CalculatorEnv) -> None:
        super().__init__(seed=0, n_train=20, n_test=5)
        self._toolbox, self.env = Toolbox(list(tools)), env

    def make(self, task: Task) -> CalculatorEnv:
        return self.env(task, self._toolbox)


def test_wrong_arguments_cover_json_schema_and_odd_values() -> None:
    spec = tool(lookup).spec
    assert wrong_arguments(spec) == [
        "{not json",
        '{"key": [[]], "scale": [[]]}',
        "{}",
        '{"key": "", "scale": 1.0}',
        '{"key": "rect", "scale": 1.0}',
        '{"key": "x", "scale": 0}',
        '{"key": "x", "scale": -1}',
        '{"key": "x", "scale": 1e+308}',
    ]


def test_a_tool_raising_on_wrong_arguments_lands_as_an_error_observation() -> None:
    found = asyncio.run(acheck_report(ToolsFactory(tool(lookup)), n_tasks=1))
    assert errors(found.issues) == []
    assert Counter((p.landing, p.detail) for p in found.probes) == {
        ("error observation", "KeyError"): 5,
        ("error observation", "invalid arguments"): 2,
        ("error observation", "invalid JSON"): 1,
    }
    assert found.summary()[:-1] == [
        "lookup: 8 calls with wrong arguments → 8 error observations (KeyError ×5, invalid arguments ×2, "
        "invalid JSON ×1); none masked"
    ]
    assert found.summary()[-1].startswith("validation: none of its own")  # then where validation comes from


def test_a_masked_fault_on_the_models_argument_is_an_error() -> None:
    declared = asyncio.run(acheck_report(ToolsFactory(tool(declares)), n_tasks=1))
    [issue, *_] = errors(declared.issues)
    assert 'declares({"key": ""}) was masked as tool_crash (declares raised ToolInfraError: no ): an exception' in str(
        issue
    )
    assert declared.summary()[:-1] == [
        "declares: 5 calls with wrong arguments → 3 error observations (invalid arguments ×2, invalid JSON ×1), "
        "2 masked faults (tool_crash ×2)"
    ]
    own = asyncio.run(acheck_report(ToolsFactory(tool(lookup), env=OwnDispatchEnv), n_tasks=1))
    text = "\n".join(map(str, errors(own.issues)))
    assert "was masked as env_error (step raised KeyError: 'rect')" in text  # the env's own step let it out
    assert "lookup({not json) was masked as env_error (step raised JSONDecodeError" in text
