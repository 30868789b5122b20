"""check_env passes on the calculator and catches contract violations in broken environments."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import pytest

from harmonyrl.envs.calculator import CalculatorEnv, CalculatorFactory
from harmonyrl.envs.checker import assert_env_ok, check_env
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
