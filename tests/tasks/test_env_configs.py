"""Each env config builds what it configures: its factory (with the config's knobs) and its scripted expert (with
the env's ``p_tool`` / ``p_verbose`` bound); no other module dispatches on the env's type. No sandbox runs here."""

from __future__ import annotations

import random
import typing

import pytest

from harmonyrl.config import load_config
from harmonyrl.tasks.config import EXTERNAL_ENVS, EnvConfig, RelayEnvConfig
from harmonyrl.tasks.factory import expert_for, make_factory

BUILT_IN = [
    member.model_fields["name"].default
    for member in typing.get_args(typing.get_args(EnvConfig)[0])
    if member.model_fields["name"].default not in ("custom", *EXTERNAL_ENVS)  # those: tests/tasks/ecosystems/
]


def test_every_built_in_env_is_listed() -> None:
    assert set(BUILT_IN) == {"calculator", "retool", "sql", "instruct", "maze", "humaneval", "browse", "relay"}


@pytest.mark.parametrize("name", BUILT_IN)
def test_config_builds_its_factory_with_its_knobs(name: str) -> None:
    env = load_config(None, [f"env.name={name}", "env.n_train=7", "env.n_test=3"]).env
    factory = env.build_factory(seed=1)
    assert factory.name == name
    assert (len(factory.tasks("train")), len(factory.tasks("test"))) == (7, 3)  # n_train / n_test reach it
    again = make_factory(env, seed=1)  # the entry point builds the same (seed and all)
    assert [t.id for t in again.tasks("train")] == [t.id for t in factory.tasks("train")]
    assert [t.prompt for t in again.tasks("test")] == [t.prompt for t in factory.tasks("test")]


@pytest.mark.parametrize("name", [n for n in BUILT_IN if n != "relay"])
def test_config_builds_its_expert_with_its_knobs(name: str) -> None:
    env = load_config(None, [f"env.name={name}", "env.n_train=5", "env.n_test=1"]).env
    task = make_factory(env, 0).tasks("train")[0]
    perfect = expert_for(env.model_copy(update={"p_tool": 1.0, "p_verbose": 0.0}))
    sloppy = expert_for(env.model_copy(update={"p_tool": 0.0, "p_verbose": 0.0}))
    demos = [(perfect(task, random.Random(s)), sloppy(task, random.Random(s))) for s in range(4)]
    assert all(good != bad for good, bad in demos)  # p_tool reached the expert: it does the job, or never does


def test_relays_single_expert_refuses_in_one_line() -> None:
    from harmonyrl.envs.loader import UserCodeError

    env = RelayEnvConfig(n_train=4, n_test=1)
    with pytest.raises(UserCodeError, match="demonstrates each role with its own expert"):
        env.build_expert()(make_factory(env, 0).tasks("train")[0], random.Random(0))
