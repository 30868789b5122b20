"""check_env passes on the calculator and catches contract violations in broken environments."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import pytest

from harmonyrl.envs.checker import assert_env_ok, check_env
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

    from harmonyrl.tasks.config import CustomEnvConfig, EnvConfig

    example = CustomEnvConfig(factory=f"{Path(__file__).parents[2] / 'examples' / 'unit_env.py'}:UnitFactory")
    return [example if cls is CustomEnvConfig else cls() for cls in get_args(get_args(EnvConfig)[0])]


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
