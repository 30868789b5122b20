"""The relay env (tasks/relay.py): its roles' views and grading, its scripted experts, the team warm start's
demonstrations (sft/team_demos.py) and its selection from the config."""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import replace

import pytest

from harmonyrl.config import ConfigError, load_config
from harmonyrl.envs.loader import UserCodeError
from harmonyrl.envs.team import TeamFactory
from harmonyrl.harmony.tokenizer import HarmonyTokenizer
from harmonyrl.sft.team_demos import build_team_demos
from harmonyrl.tasks.calculator import CalculatorFactory, expression_of
from harmonyrl.tasks.config import RelayEnvConfig
from harmonyrl.tasks.factory import expert_for, make_factory
from harmonyrl.tasks.relay import EXECUTOR_INSTRUCTIONS, PLANNER_INSTRUCTIONS, executor_demo, planner_demo
from harmonyrl.types import Message

TOK = HarmonyTokenizer.load_default()
TEAM = make_factory(RelayEnvConfig(n_train=40, n_test=4), seed=0)
TASK = TEAM.tasks("train")[0]


def test_the_relay_is_a_team_over_the_calculators_problems() -> None:
    assert isinstance(TEAM, TeamFactory) and TEAM.roles == ("planner", "executor")
    solo = CalculatorFactory(0, 40, 4)
    assert TEAM.tasks("train") == solo.tasks("train") and TEAM.tasks("test") == solo.tasks("test")


def test_the_planner_has_no_tool_and_the_executor_only_its_plan() -> None:
    planner = TEAM.role_factory(0).make(TASK)
    assert list(planner.tools) == [] and planner.instructions == PLANNER_INSTRUCTIONS
    assert asyncio.run(planner.reset()) == [Message("user", TASK.prompt)]
    seen = replace(TASK, prompt="Compute 2 * 3")
    executor = TEAM.role_factory(1).make(seen)
    assert [t.name for t in executor.tools] == ["calculator"] and executor.instructions == EXECUTOR_INSTRUCTIONS
    assert asyncio.run(executor.reset()) == [Message("user", "Compute 2 * 3")]  # not the question
    graded = asyncio.run(executor.step([Message("assistant", TASK.answer, "final")]))
    assert graded.reward == 1.0 and graded.terminated  # graded against the real task's answer


def test_the_experts_hand_over_the_expression_or_guess() -> None:
    rng = random.Random(0)
    plans = [planner_demo(TASK, rng, p_plan=0.5)[0].content for _ in range(200)]
    handed = [p for p in plans if p == f"Compute {expression_of(TASK)}"]
    assert 70 < len(handed) < 130 and all(p.startswith("The answer is ") for p in plans if p not in handed)
    # a plan with an expression: the calculator on it, then the number
    demo = executor_demo(replace(TASK, prompt=handed[0]), random.Random(0), p_tool=1.0, p_verbose=0.0)
    assert demo[0].tool_name == "calculator" and json.loads(demo[0].content) == {"expression": expression_of(TASK)}
    assert demo[-1].content == TASK.answer
    # a guessed plan: the executor copies the planner's number
    assert executor_demo(replace(TASK, prompt="The answer is 1234."), random.Random(0))[-1].content == "1234"


def test_the_team_warm_start_demonstrates_each_role_on_what_it_sees() -> None:
    demos = asyncio.run(build_team_demos(TOK, TEAM, TEAM.tasks("train")[:3], seed=0))
    assert len(demos) == 6  # planner, executor per task
    for k, task in enumerate(TEAM.tasks("train")[:3]):
        planner, executor = TOK.decode(list(demos[2 * k].ids)), TOK.decode(list(demos[2 * k + 1].ids))
        assert PLANNER_INSTRUCTIONS in planner and task.prompt in planner
        assert EXECUTOR_INSTRUCTIONS in executor and task.prompt not in executor
        plan = planner.rsplit("<|message|>", 1)[1].removesuffix("<|return|>")
        assert f"<|start|>user<|message|>{plan}<|end|>" in executor  # the executor's prompt is the demo's plan
        for demo in demos[2 * k : 2 * k + 2]:  # each role's loss mask covers its own turns only
            masked = TOK.decode([i for i, m in zip(demo.ids, demo.mask, strict=True) if m])
            assert "<|start|>user" not in masked and "developer" not in masked
    again = asyncio.run(build_team_demos(TOK, TEAM, TEAM.tasks("train")[:3], seed=0))
    assert again == demos


def test_the_env_is_chosen_on_the_command_line_and_refuses_what_it_cannot_do() -> None:
    assert isinstance(load_config(None, ["env.name=relay", "env.p_plan=0.5"]).env, RelayEnvConfig)
    with pytest.raises(ConfigError, match="does not support env_faults"):
        load_config(None, ["env.name=relay", "env_faults.rate=0.1"])
    with pytest.raises(UserCodeError, match=r"sft\.expert is not supported"):
        expert_for(RelayEnvConfig(), "mymodule:expert")
    with pytest.raises(UserCodeError, match="exporting its demonstrations is not supported"):
        expert_for(RelayEnvConfig())(TASK, random.Random(0))  # a single-expert caller: --export-demos
