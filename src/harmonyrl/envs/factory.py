"""From the typed ``env`` config to an environment factory and its scripted expert (for the SFT warm start).

A ``match`` on the config type, not a string registry: adding an environment means adding its config class to
the union in :mod:`harmonyrl.config` and one case here, and a typo in ``env.name`` is a config error.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable

from harmonyrl.config import CalculatorEnvConfig, EnvConfig, RetoolEnvConfig, RewardWeightsConfig, SqlEnvConfig
from harmonyrl.envs.base import EnvFactory
from harmonyrl.envs.reward import RewardWeights
from harmonyrl.types import Message, Task

Expert = Callable[[Task, random.Random, float, float], list[Message]]
"""``expert(task, rng, p_tool, p_verbose)`` → the assistant side of a demonstration."""


def _weights(cfg: RewardWeightsConfig) -> RewardWeights:
    return RewardWeights(**cfg.model_dump())


def make_factory(env: EnvConfig, seed: int) -> EnvFactory:
    """The factory for ``env`` (imports are per environment: the sandbox is only needed by ``retool``)."""
    match env:
        case CalculatorEnvConfig():
            from harmonyrl.envs.calculator import CalculatorFactory

            return CalculatorFactory(seed, env.n_train, env.n_test, tool_timeout_s=env.tool_timeout_s)
        case RetoolEnvConfig():
            from harmonyrl.envs.retool import DEFAULT_LIMITS, RetoolFactory

            limits = dataclasses.replace(DEFAULT_LIMITS, timeout_s=env.timeout_s)
            return RetoolFactory(
                seed, env.n_train, env.n_test, limits, env.allow_unsafe, _weights(env.reward), env.tasks_file
            )
        case SqlEnvConfig():
            from harmonyrl.envs.sql import SqlFactory

            return SqlFactory(
                seed, env.n_train, env.n_test, env.query_timeout_s, env.max_rows, _weights(env.reward), env.tasks_file
            )
    raise AssertionError(f"unhandled env config {type(env).__name__}")  # pragma: no cover - the union is closed


def expert_for(env: EnvConfig) -> Expert:
    """The scripted, deliberately imperfect expert whose demonstrations warm-start the policy."""
    match env:
        case CalculatorEnvConfig():
            from harmonyrl.envs.calculator import expert_demo
        case RetoolEnvConfig():
            from harmonyrl.envs.retool import expert_demo
        case SqlEnvConfig():
            from harmonyrl.envs.sql import expert_demo
    return expert_demo
