"""Instruct env: generated tasks and splits, exact rewards for scripted answers, the expert, task files, wiring."""

from __future__ import annotations

import asyncio
import functools
import json
import random
from collections.abc import Sequence
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fakes import ScriptedEngine
from harmonyrl.cli import app
from harmonyrl.config import load_config
from harmonyrl.envs.checker import assert_env_ok
from harmonyrl.envs.reward import RewardWeights
from harmonyrl.envs.taskfile import TaskFileError
from harmonyrl.harmony.render import render_completion
from harmonyrl.harmony.tokenizer import HarmonyTokenizer
from harmonyrl.rollout.agent_loop import EpisodeLimits, initial_messages, run_episode
from harmonyrl.tasks.constraints import Constraint
from harmonyrl.tasks.factory import expert_for, make_factory
from harmonyrl.tasks.instruct import (
    INSTRUCTIONS,
    VERBOSE_PREAMBLE,
    InstructFactory,
    expert_demo,
    parse_task,
    render_prompt,
    task_key,
    topic_of,
    write,
)
from harmonyrl.types import Message, SamplingParams, StepResult, Task


def small() -> InstructFactory:
    return InstructFactory(seed=0, n_train=400, n_test=40)


FACTORY = small()
TRAIN, TEST = FACTORY.tasks("train"), FACTORY.tasks("test")
C = Constraint
TASK = Task(
    "t", render_prompt("Describe the sea.", [C("max_words", n=10), C("no_commas"), C("lowercase")]), "x", "train"
)


def play(actions: Sequence[Sequence[Message]], task: Task = TASK, weights: RewardWeights | None = None):
    factory = InstructFactory(n_train=1, n_test=1, weights=weights or RewardWeights())

    async def go() -> list[StepResult]:
        env = factory.make(task)
        await env.reset()
        return [await env.step(a) for a in actions]

    return asyncio.run(go())


def final(text: str) -> list[Message]:
    return [Message("assistant", text, channel="final")]


def test_check_env_passes() -> None:
    assert_env_ok(FACTORY, rebuild=small)


def test_check_env_command_passes() -> None:
    result = CliRunner().invoke(app, ["check-env", "harmonyrl.tasks.instruct:InstructFactory", "--tasks", "3"])
    assert result.exit_code == 0, result.output
    assert "environment contract OK (3 of 5000 train tasks and 1 test task driven)" in result.output


def test_scripted_answers_earn_exact_rewards() -> None:
    calm = "a calm sea at night under a quiet moon."
    [good] = play([final(calm)])  # 9 words <= 10, names "sea"
    assert (good.reward, good.terminated, good.info["correct"], good.info["constraints_met"]) == (1.0, True, 1.0, 1.0)
    [bad] = play([final("A calm sea, at night under a quiet moon.")])  # breaks no_commas and lowercase only
    assert (bad.reward, bad.info["correct"], bad.info["constraints_met"]) == (0.0, 0.0, 1 / 3)
    shaped = RewardWeights(outcome=0.5, format=0.5)
    [partial] = play([final("A calm sea, at night under a quiet moon.")], weights=shaped)
    assert partial.reward == pytest.approx(0.5 / 3) and partial.info["reward/format"] == pytest.approx(0.5 / 3)
    [thinking] = play([[Message("assistant", "a calm sea.", channel="analysis")]])
    assert (thinking.reward, thinking.terminated, thinking.info["format_error"]) == (0.0, True, 1.0)


def test_a_tool_call_is_an_unknown_tool_observation_then_turns_cost() -> None:
    call = Message("assistant", "{}", channel="commentary", recipient="functions.search", content_type="json")
    answer = final("a calm sea at night under a quiet moon.")
    first, second = play([[call], answer], weights=RewardWeights(outcome=0.9, step_cost=0.1))
    assert first.failure is None and not first.terminated and first.info == {"tool_error": 1.0}
    assert json.loads(first.observations[0].content) == {"error": "unknown tool 'search'; available tools: none"}
    assert second.reward == pytest.approx(0.9 - 0.2) and second.info["turns"] == 2.0


def test_generated_tasks_are_satisfiable_and_splits_disjoint() -> None:
    for task in (*TRAIN, *TEST):
        constraints = parse_task(task.prompt)[1]
        assert 1 <= len(constraints) <= 3 and all(c.holds(task.answer) for c in constraints), task
    assert len({c.kind for t in TRAIN for c in parse_task(t.prompt)[1]}) == 13
    big = InstructFactory(seed=0, n_train=800, n_test=80)
    assert (big.tasks("train")[:400], big.tasks("test")[:40]) == (TRAIN, TEST)  # prefix-stable
    other = InstructFactory(seed=1, n_train=400, n_test=40)
    assert other.tasks("train") != TRAIN
    keys = {s: {task_key(*parse_task(t.prompt)) for f in (big, other) for t in f.tasks(s)} for s in ("train", "test")}
    assert not keys["train"] & keys["test"]  # the key ignores constraint order, so no reordered leak either


def test_expert_is_compliant_or_breaks_one_constraint() -> None:
    rewards = []
    for i, task in enumerate(TRAIN):
        [msg] = expert_demo(task, random.Random(i), p_tool=0.7)
        [result] = play([[msg]], task)
        rewards.append(result.reward)
        broken = sum(not c.holds(msg.content) for c in parse_task(task.prompt)[1])
        assert msg.channel == "final" and (result.reward, result.info["correct"]) == (
            (1.0, 1.0) if broken == 0 else (0.0, 0.0)
        )
    assert abs(sum(rewards) / len(rewards) - 0.7) < 0.08
    for i, task in enumerate(TRAIN[:100]):  # every deliberate break really breaks the constraint chosen
        request, constraints = parse_task(task.prompt)
        for c in constraints:
            assert not c.holds(write(constraints, topic_of(request), random.Random(i), c.kind)), (task.prompt, c)
    assert expert_demo(TRAIN[3], random.Random(5)) == expert_demo(TRAIN[3], random.Random(5))
    [chatty] = expert_demo(TRAIN[0], random.Random(0), p_tool=1.0, p_verbose=1.0)
    assert chatty.content.startswith(VERBOSE_PREAMBLE)


def test_task_file_loads_and_errors_name_the_line(tmp_path: Path) -> None:
    rows = [
        {"id": "a", "split": "train", "prompt": "Write a haiku about rain.",
         "constraints": [{"kind": "max_words", "args": {"n": 20}}, {"kind": "no_commas"}]},
        {"id": "b", "split": "test", "prompt": "Describe a harbour.",
         "constraints": [{"kind": "bullets", "args": {"n": 3}}, {"kind": "start_with", "args": {"word": "Dawn"}}]},
    ]  # fmt: skip
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    factory = InstructFactory(tasks_file=path)
    [train], [test] = factory.tasks("train"), factory.tasks("test")
    assert train.prompt == "Write a haiku about rain.\nUse at most 20 words.\nDo not use any commas."
    assert parse_task(test.prompt)[1] == (C("bullets", n=3), C("start_with", words=("Dawn",)))
    assert all(c.holds(t.answer) for t in (train, test) for c in parse_task(t.prompt)[1])
    assert_env_ok(factory, n_tasks=1)
    path.write_text(json.dumps({**rows[0], "constraints": [{"kind": "forbid_word", "args": {"word": "the"}}]}))
    [plain] = InstructFactory(tasks_file=path).tasks("train")  # the writer avoids filler with a forbidden word
    assert plain.answer and "the" not in plain.answer.lower().split()
    bad = {
        '{"id": "c", "split": "train", "prompt": "Hi.", "constraints": [{"kind": "shout"}]}': "unknown constraint",
        '{"id": "c", "split": "dev", "prompt": "Hi.", "constraints": []}': "'split' must be",
        '{"id": "c", "split": "train", "prompt": "Hi.", "constraints": []}': "at least one constraint",
        '{"id": "c", "split": "train", "prompt": "Hi.", "constraint": []}': "keys must be exactly",
        '{"id": "a", "split": "train", "prompt": "Hi.", "constraints": [{"kind": "json"}]}': "duplicate id 'a'",
        '{"id": "c", "split": "train", "prompt": "Hi.", "constraints": [{"kind": "bullets", "args": {"n": 12}},'
        ' {"kind": "max_words", "args": {"n": 20}}]}': "the built-in writer found no response",
        '{"id": "c", "split": "train", "prompt": "Hi.", "constraints": [{"kind": "max_words", "args": {"n": 7}}]}': (
            "max_words must be at least 8"
        ),
        '{"id": "c", "split": "train", "prompt": "Hi.", "constraints": [{"kind": "forbid_word", '
        '"args": {"word": "It"}}, {"kind": "include_keywords", "args": {"words": ["sun"]}}]}': "writer found no",
        "{not json": "not valid JSON",
    }
    for line, message in bad.items():
        path.write_text(json.dumps(rows[0]) + "\n" + line + "\n")
        with pytest.raises(TaskFileError) as e:
            InstructFactory(tasks_file=path)
        assert str(e.value).startswith(f"{path}:2: ") and message in str(e.value), str(e.value)
    path.write_text(json.dumps(rows[0]) + "\n" + json.dumps({**rows[0], "id": "z", "split": "test"}) + "\n")
    with pytest.raises(TaskFileError, match=r":2: same task also in the train split \(line 1\)"):
        InstructFactory(tasks_file=path)


def test_zero_tool_env_renders_and_runs_in_the_agent_loop() -> None:
    tok = HarmonyTokenizer.load_default()
    env = FACTORY.make(TASK)
    system, developer, user = initial_messages(env, asyncio.run(env.reset()))
    assert "functions" not in system.content and developer.content == f"# Instructions\n\n{INSTRUCTIONS}"
    assert user.content == TASK.prompt
    calm = Message("assistant", "a calm sea at night under a quiet moon.", channel="final")
    completion = render_completion(tok, [calm])
    traj = asyncio.run(
        run_episode(
            ScriptedEngine([completion]), env, tok, SamplingParams(stop_ids=tok.special.stop_ids),
            EpisodeLimits(2, 64, 512), task_id=TASK.id, group_id=0, seed=0,
        )
    )  # fmt: skip
    assert (traj.reward, traj.terminated, traj.success, traj.reward_terms["constraints_met"]) == (1.0, True, True, 1.0)


def test_config_wiring() -> None:
    config = load_config(overrides=["env.name=instruct", "env.n_train=50", "env.n_test=5", "env.reward.format=0.5",
                                    "env.reward.outcome=0.5"])  # fmt: skip
    factory = make_factory(config.env, seed=0)
    assert isinstance(factory, InstructFactory) and factory.weights == RewardWeights(outcome=0.5, format=0.5)
    expert = expert_for(config.env)  # the scripted expert with the env's p_tool / p_verbose bound
    assert isinstance(expert, functools.partial) and expert.func is expert_demo
    assert expert.keywords == {"p_tool": config.env.p_tool, "p_verbose": config.env.p_verbose}


def test_a_draw_the_writer_cannot_answer_is_skipped_not_a_crash() -> None:
    """Seed 1 draws '4 bullets, at most 35 words, include two keywords' among its first 5,000 problems, which the
    built-in writer cannot meet: that problem is skipped (the factory used to die with a WriterError traceback)."""
    factory = InstructFactory(seed=1, n_train=5000, n_test=200)
    tasks = (*factory.tasks("train"), *factory.tasks("test"))
    assert len(tasks) == 5200
    assert all(c.holds(t.answer) for t in tasks[::97] for c in parse_task(t.prompt)[1])
    assert InstructFactory(seed=1, n_train=400, n_test=40).tasks("train") == factory.tasks("train")[:400]
