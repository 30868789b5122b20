"""From the typed ``env`` config to an environment factory and its scripted expert (for the SFT warm start).

A ``match`` on the config type, not a string registry: adding an environment means adding its config class to
the union in :mod:`harmonyrl.tasks.config` and one case here, and a typo in ``env.name`` is a config error.
"""

from __future__ import annotations

import dataclasses
import functools
import random
from collections.abc import Callable

from harmonyrl.envs.base import EnvFactory
from harmonyrl.envs.reward import RewardWeights
from harmonyrl.tasks.config import (
    BrowseEnvConfig,
    CalculatorEnvConfig,
    EnvConfig,
    HumanEvalEnvConfig,
    InstructEnvConfig,
    MazeEnvConfig,
    RetoolEnvConfig,
    RewardWeightsConfig,
    SqlEnvConfig,
)
from harmonyrl.types import Message, Task

Expert = Callable[[Task, random.Random, float, float], list[Message]]
"""``expert(task, rng, p_tool, p_verbose)`` → the assistant side of a demonstration."""


def _weights(cfg: RewardWeightsConfig) -> RewardWeights:
    return RewardWeights(**cfg.model_dump())


def make_factory(env: EnvConfig, seed: int) -> EnvFactory:
    """The factory for ``env``, its episodes wrapped with the notes tools when ``env.memory`` is set."""
    factory = _env_factory(env, seed)
    if env.memory:
        from harmonyrl.envs.memory import with_memory

        return with_memory(factory)
    return factory


def _env_factory(env: EnvConfig, seed: int) -> EnvFactory:
    """The env's own factory (imports are per environment: the sandbox is only needed by ``retool``)."""
    match env:
        case CalculatorEnvConfig():
            from harmonyrl.tasks.calculator import CalculatorFactory

            return CalculatorFactory(seed, env.n_train, env.n_test, tool_timeout_s=env.tool_timeout_s)
        case RetoolEnvConfig():
            from harmonyrl.tasks.retool import DEFAULT_LIMITS, RetoolFactory

            limits = dataclasses.replace(DEFAULT_LIMITS, timeout_s=env.timeout_s)
            return RetoolFactory(
                seed, env.n_train, env.n_test, limits, env.allow_unsafe, _weights(env.reward), env.tasks_file
            )
        case SqlEnvConfig():
            from harmonyrl.tasks.sql import SqlFactory

            return SqlFactory(
                seed, env.n_train, env.n_test, env.query_timeout_s, env.max_rows, _weights(env.reward), env.tasks_file
            )
        case InstructEnvConfig():
            from harmonyrl.tasks.instruct import InstructFactory

            return InstructFactory(seed, env.n_train, env.n_test, _weights(env.reward), env.tasks_file)
        case MazeEnvConfig():
            from harmonyrl.tasks.maze import MazeFactory

            return MazeFactory(seed, env.n_train, env.n_test, env.size, env.max_turns, _weights(env.reward))
        case HumanEvalEnvConfig():
            from harmonyrl.tasks.humaneval import GRADER_LIMITS, TOOL_LIMITS, HumanEvalFactory

            tool = dataclasses.replace(TOOL_LIMITS, timeout_s=env.tool_timeout_s)
            grader = dataclasses.replace(GRADER_LIMITS, timeout_s=env.test_timeout_s)
            return HumanEvalFactory(env.n_train, env.n_test, tool, grader, env.allow_unsafe, _weights(env.reward))
        case BrowseEnvConfig():
            from harmonyrl.tasks.browse import BrowseFactory

            return BrowseFactory(
                seed, env.n_train, env.n_test, env.top_k, env.page_chars, _weights(env.reward), env.tasks_file
            )
    raise AssertionError(f"unhandled env config {type(env).__name__}")  # pragma: no cover - the union is closed


def expert_for(env: EnvConfig) -> Expert:
    """The scripted, deliberately imperfect expert whose demonstrations warm-start the policy."""
    match env:
        case CalculatorEnvConfig():
            from harmonyrl.tasks.calculator import expert_demo
        case RetoolEnvConfig():
            from harmonyrl.tasks.retool import expert_demo
        case SqlEnvConfig():
            from harmonyrl.tasks.sql import expert_demo
        case InstructEnvConfig():
            from harmonyrl.tasks.instruct import expert_demo
        case MazeEnvConfig():
            from harmonyrl.tasks.maze import expert_demo
        case HumanEvalEnvConfig():
            from harmonyrl.tasks.humaneval import expert_demo
        case BrowseEnvConfig():  # its demos must page through the same windows as the configured tools
            from harmonyrl.tasks.browse import expert_demo as browse_demo

            return functools.partial(browse_demo, top_k=env.top_k, page_chars=env.page_chars)
    return expert_demo
