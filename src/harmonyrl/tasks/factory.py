"""From the typed ``env`` config to an environment factory and its expert (for the SFT warm start).

A ``match`` on the config type, not a string registry: adding an environment means adding its config class to
the union in :mod:`harmonyrl.tasks.config` and one case here, and a typo in ``env.name`` is a config error.
``custom`` is the user's own factory (:mod:`harmonyrl.tasks.custom`); ``sft.expert`` the user's own expert.
"""

from __future__ import annotations

import dataclasses
import functools
import random

from harmonyrl.envs.base import EnvFactory
from harmonyrl.envs.loader import UserCodeError
from harmonyrl.envs.reward import RewardWeights
from harmonyrl.tasks.config import (
    NO_EXPERT,
    BrowseEnvConfig,
    CalculatorEnvConfig,
    CustomEnvConfig,
    EnvConfig,
    HumanEvalEnvConfig,
    InstructEnvConfig,
    MazeEnvConfig,
    RelayEnvConfig,
    RetoolEnvConfig,
    RewardWeightsConfig,
    SqlEnvConfig,
)
from harmonyrl.tasks.custom import Expert, HashOrdered, custom_expert, custom_factory, require_env_ok
from harmonyrl.types import Message, Task

RELAY_NO_USER_EXPERT = (
    "env.name=relay warm-starts each role from its own scripted expert: sft.expert is not supported with it "
    "(use sft.demos=FILE or sft.steps=0 instead)"
)


def _one_role_only(task: Task, rng: random.Random) -> list[Message]:
    """What a single-expert caller (``harmonyrl sft --export-demos``) gets for a team env: a one-line refusal."""
    raise UserCodeError(
        "env.name=relay demonstrates each role with its own expert (trainer/team_demos.py): "
        "exporting its demonstrations is not supported"
    )


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

            return CalculatorFactory(
                seed, env.n_train, env.n_test, env.tool_timeout_s, env.levels, env.test_levels, env.operand_values
            )
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
            return HumanEvalFactory(env.n_train, env.n_test, tool, grader, _weights(env.reward))
        case BrowseEnvConfig():
            from harmonyrl.tasks.browse import BrowseFactory

            knobs = (env.top_k, env.page_chars, _weights(env.reward), env.tasks_file, env.worlds)
            return BrowseFactory(seed, env.n_train, env.n_test, *knobs)
        case RelayEnvConfig():
            from harmonyrl.tasks.relay import RelayFactory

            experts = (env.p_plan, env.p_tool, env.p_verbose)
            return RelayFactory(seed, env.n_train, env.n_test, env.tool_timeout_s, *experts)
        case CustomEnvConfig():  # the user's own: ``seed`` is theirs to take, as an ``env.kwargs`` entry
            factory = custom_factory(env.factory, env.kwargs)
            return HashOrdered(factory) if env.order == "hashed" else factory
    raise AssertionError(f"unhandled env config {type(env).__name__}")  # pragma: no cover - the union is closed


async def check_before_compute(
    env: EnvConfig, factory: EnvFactory, seed: int, sft_steps: int = 0, user_expert: str | None = None
) -> None:
    """The user's own code, before a run computes anything (and before its folder exists): ``check_env`` on a
    ``custom`` env (the built-in envs are checked by their tests instead) and, when the warm start runs
    (``sft_steps`` > 0), its expert: ``user_expert`` (``sft.expert``) loaded and asked for one demonstration, or
    the one-line error that a custom env has none. A problem is a :class:`~harmonyrl.envs.loader.UserCodeError`."""
    if isinstance(env, CustomEnvConfig):
        await require_env_ok(factory, functools.partial(make_factory, env, seed), env.factory)
    if sft_steps == 0:
        return
    expert = expert_for(env, user_expert)
    if user_expert is not None and (tasks := factory.tasks("train")):
        expert(tasks[0], random.Random(seed))


def expert_for(env: EnvConfig, user_expert: str | None = None) -> Expert:
    """The expert whose demonstrations warm-start the policy: ``user_expert`` (``sft.expert``, a
    ``MODULE:FN`` / ``FILE.py:FN`` target) if given, else the env's scripted, deliberately imperfect one with
    the env's ``p_tool`` / ``p_verbose`` bound."""
    if isinstance(env, RelayEnvConfig):  # each role has its own expert: the warm start asks the team factory
        if user_expert is not None:
            raise UserCodeError(RELAY_NO_USER_EXPERT)
        return _one_role_only
    if user_expert is not None:
        return custom_expert(user_expert)
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

            return functools.partial(
                browse_demo,
                p_tool=env.p_tool,
                p_verbose=env.p_verbose,
                top_k=env.top_k,
                page_chars=env.page_chars,
                cite=env.cite,
            )
        case CustomEnvConfig():  # checked before compute (check_before_compute), so it is said before the run
            raise UserCodeError(NO_EXPERT)
    return functools.partial(expert_demo, p_tool=env.p_tool, p_verbose=env.p_verbose)
