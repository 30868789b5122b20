"""From the typed ``env`` config to an environment factory and its expert (for the SFT warm start).

Each env config builds its own (``build_factory`` / ``build_expert`` in :mod:`harmonyrl.tasks.config`); these
entry points add only what is the same for every env: the notes tools when ``env.memory`` is set, the check of
the user's own code before compute, and the user's own expert (``sft.expert``) in place of the scripted one.
``custom`` is the user's own factory (:mod:`harmonyrl.tasks.custom`).
"""

from __future__ import annotations

import functools
import random
from typing import TYPE_CHECKING

from harmonyrl.envs.base import EnvFactory
from harmonyrl.envs.loader import UserCodeError
from harmonyrl.tasks.config import CustomEnvConfig, EnvConfig, RelayEnvConfig
from harmonyrl.tasks.custom import Expert, custom_expert, require_env_ok
from harmonyrl.tasks.ecosystems.textarena_config import TextArenaEnvConfig

if TYPE_CHECKING:
    from harmonyrl.tasks.ecosystems.textarena_seats import SeatPlayer

RELAY_NO_USER_EXPERT = (
    "env.name=relay warm-starts each role from its own scripted expert: sft.expert is not supported with it "
    "(use sft.demos=FILE or sft.steps=0 instead)"
)


def make_factory(env: EnvConfig, seed: int, opponent: SeatPlayer | None = None) -> EnvFactory:
    """The factory for ``env``, its episodes wrapped with the notes tools when ``env.memory`` is set. ``opponent``:
    the player of a TextArena game's checkpoint opponent (``env.opponent=<folder>``; the run builds it)."""
    if opponent is None:
        factory = env.build_factory(seed)
    elif isinstance(env, TextArenaEnvConfig):
        factory = env.build_factory(seed, opponent)
    else:
        raise ValueError(f"env.name={env.name} has no seat for an opponent")
    if env.memory:
        from harmonyrl.envs.memory import with_memory

        return with_memory(factory)
    return factory


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
    the env's knobs bound (``build_expert``; a custom env's is the one-line error that it has none)."""
    if user_expert is None:
        return env.build_expert()
    if isinstance(env, RelayEnvConfig):  # each role has its own expert: the warm start asks the team factory
        raise UserCodeError(RELAY_NO_USER_EXPERT)
    return custom_expert(user_expert)
