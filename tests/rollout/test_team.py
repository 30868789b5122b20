"""Team episodes (rollout/team.py) on the relay env: role views, per-role loss masks, the team's reward and its
credit assignment, faults, and per-role metrics.

The engine is scripted from the prompt it is asked to continue: a planner prompt (the planner's instructions)
gets ``Compute EXPR`` (or, for the tasks in ``GUESSED``, a wrong guess), an executor prompt a calculator call on
the expression it can see and, once the tool answered, that result — so the team's outcome is known by hand.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Sequence

import pytest
import torch

from fakes import ScriptedEngine
from harmonyrl.algorithms.advantages import group_relative_advantages, rloo_advantages
from harmonyrl.harmony.render import render_completion
from harmonyrl.harmony.tokenizer import HarmonyTokenizer
from harmonyrl.rollout.agent_loop import EpisodeLimits
from harmonyrl.rollout.scheduler import EpisodeRequest, group_requests
from harmonyrl.rollout.team import (
    ROLE_TERM,
    assign_team_reward,
    handoff,
    one_per_episode,
    role_metrics,
    role_seed,
    run_rollouts,
)
from harmonyrl.tasks.calculator import expression_of
from harmonyrl.tasks.relay import EXECUTOR_INSTRUCTIONS, PLANNER_INSTRUCTIONS, RelayFactory
from harmonyrl.types import Failure, Message, SamplingParams, Trajectory

TOK = HarmonyTokenizer.load_default()
TEAM = RelayFactory(seed=0, n_train=8, n_test=1)
TASKS = TEAM.tasks("train")[:4]
GUESSED = {TASKS[1].id}
"""Tasks whose scripted planner guesses a (wrong) number instead of handing over the expression."""
PARAMS = SamplingParams(stop_ids=TOK.special.stop_ids)
LIMITS = EpisodeLimits(max_turns=4, max_new_tokens=64, max_seq_len=512)


def final(text: str) -> list[int]:
    return render_completion(TOK, [Message("assistant", text, "final")])


def script(prompt: Sequence[int]) -> list[int]:
    text = TOK.decode(list(prompt))
    if PLANNER_INSTRUCTIONS in text:
        task = next(t for t in TASKS if t.prompt in text)
        return final("The answer is 7.") if task.id in GUESSED else final(f"Compute {expression_of(task)}")
    assert EXECUTOR_INSTRUCTIONS in text
    if "<|call|>" in text:
        return final(str(json.loads(text.rsplit("<|message|>", 1)[1].split("<|end|>")[0])["result"]))
    plan = text.rsplit("<|start|>user<|message|>", 1)[1].split("<|end|>")[0]
    if (expr := re.search(r"\d[\d+\-*() ]*\d", plan)) is None or expr.group(0).isdigit():
        return final(plan.removeprefix("The answer is ").rstrip("."))
    call = Message("assistant", json.dumps({"expression": expr.group(0)}), "commentary", "functions.calculator",
                   content_type="json")  # fmt: skip
    return render_completion(TOK, [call])


def run(requests: Sequence[EpisodeRequest]) -> tuple[ScriptedEngine, tuple[Trajectory, ...]]:
    engine = ScriptedEngine(script)
    result = asyncio.run(run_rollouts(engine, TEAM, TOK, requests, PARAMS, LIMITS, 8))
    return engine, result.trajectories


def test_the_executor_never_sees_the_question_and_the_planner_never_sees_the_tool() -> None:
    engine, trajectories = run(group_requests(TASKS, 1, base_seed=0))
    executor = [TOK.decode(p) for p in engine.prompts if EXECUTOR_INSTRUCTIONS in TOK.decode(p)]
    planner = [TOK.decode(p) for p in engine.prompts if PLANNER_INSTRUCTIONS in TOK.decode(p)]
    assert len(planner) == 4 and len(executor) == 4 + 3  # 3 executors called the tool: one more turn each
    for text in executor:
        assert not any(t.prompt in text for t in TASKS)  # the question is nowhere in what it is given
    for task in TASKS:
        if task.id not in GUESSED:  # ... only the planner's instruction is
            assert any(f"Compute {expression_of(task)}" in text for text in executor)
    assert all("functions" not in text for text in planner)  # the planner is declared no tool
    assert len(trajectories) == 8  # request by request, each request's roles in order
    assert [t.reward_terms[ROLE_TERM] for t in trajectories] == [0.0, 1.0] * 4


def test_each_role_has_its_own_tokens_and_a_loss_mask_on_its_own_samples_only() -> None:
    _, trajectories = run(group_requests(TASKS[:1], 1, base_seed=0))
    planner, executor = trajectories
    plan = final(f"Compute {expression_of(TASKS[0])}")
    # the planner sampled exactly its plan: the mask is 1 on those ids, 0 on the whole prompt
    assert planner.num_sampled == len(plan)
    assert [i for i, m in zip(planner.token_ids, planner.loss_mask, strict=True) if m] == plan
    assert planner.token_ids[-len(plan) :] == tuple(plan)
    # the executor's stream holds the plan as its user message (context, mask 0), then its own two turns
    sampled = [i for i, m in zip(executor.token_ids, executor.loss_mask, strict=True) if m]
    assert executor.num_sampled == len(sampled) > 0
    expr = expression_of(TASKS[0])
    call = Message("assistant", json.dumps({"expression": expr}), "commentary", "functions.calculator",
                   content_type="json")  # fmt: skip
    assert sampled == render_completion(TOK, [call]) + final(TASKS[0].answer)  # its own two turns, nothing else
    plan_ids = TOK.encode(f"Compute {expr}")
    ids = list(executor.token_ids)
    start = next(k for k in range(len(ids)) if ids[k : k + len(plan_ids)] == plan_ids)
    assert set(executor.loss_mask[start : start + len(plan_ids)]) == {0}  # the plan is context to it


def test_both_roles_get_the_teams_reward() -> None:
    _, trajectories = run(group_requests(TASKS, 1, base_seed=0))
    for k, task in enumerate(TASKS):
        planner, executor = trajectories[2 * k : 2 * k + 2]
        solved = 0.0 if task.id in GUESSED else 1.0  # a guessed plan: the executor copies a wrong number
        assert planner.reward == executor.reward == solved
        assert planner.success == executor.success == bool(solved)
        assert planner.group_id == executor.group_id == k
    assert [t.task_id for t in one_per_episode(trajectories)] == [t.id for t in TASKS]


def test_roles_sample_with_their_own_seeds() -> None:
    assert role_seed(5, 0) == 5
    assert role_seed(5, 1) != 5 and role_seed(5, 1) == role_seed(5, 1) and role_seed(5, 1) != role_seed(6, 1)


def traj(reward: float, role: int, group: int = 0, failure: Failure | None = None) -> Trajectory:
    terms = {"correct": reward} if role == 1 else {"handoff": 1.0}
    return Trajectory("t", group, (1, 2), (0, 1), (0.0, -0.5), reward, True, False, failure, (), reward_terms=terms)


def test_credit_assignment_is_each_roles_group_relative_advantage_up_to_a_group_size_factor() -> None:
    # Two team episodes of one task (G = 2): the team solved the first, failed the second.
    stages = [[traj(0.0, 0), traj(0.0, 0)], [traj(1.0, 1), traj(0.0, 1)]]
    team = [t for roles in assign_team_reward(stages) for t in roles]  # planner, executor, planner, executor
    rewards = torch.tensor([t.reward for t in team])
    assert rewards.tolist() == [1.0, 1.0, 0.0, 0.0]
    groups = torch.tensor([t.group_id for t in team])
    # GRPO over the task's 4 role-episodes: mean 1/2, unbiased std sqrt(4 · (1/2)² / 3) = sqrt(1/3) → ±sqrt(3)/2
    grpo = group_relative_advantages(rewards, groups, eps=0.0)
    assert grpo.tolist() == pytest.approx([0.8660254, 0.8660254, -0.8660254, -0.8660254])
    # per role (G = 2 each): mean 1/2, std sqrt(1/2) → ±sqrt(1/2) = ±0.7071; factor sqrt((2G-1)/(2(G-1))) = sqrt(3/2)
    per_role = group_relative_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), eps=0.0)
    assert per_role.tolist() == pytest.approx([0.7071068, -0.7071068])
    assert (grpo[::2] / per_role).tolist() == pytest.approx([1.5**0.5] * 2)
    # RLOO: 1 - (1 + 0 + 0)/3 = 2/3 vs per role 1 - 0 = 1: factor 2(G-1)/(2G-1) = 2/3
    assert rloo_advantages(rewards, groups).tolist() == pytest.approx([2 / 3, 2 / 3, -2 / 3, -2 / 3])


def test_a_failed_role_masks_every_role_of_its_episode() -> None:
    fault = Failure("tool_timeout", "calculator")
    stages = [[traj(0.0, 0), traj(0.0, 0)], [traj(0.0, 1, failure=fault), traj(1.0, 1)]]
    (planner, executor), (ok_planner, ok_executor) = assign_team_reward(stages)
    assert planner.failure == executor.failure == fault and planner.reward == 0.0
    assert ok_planner.failure is None and ok_planner.reward == ok_executor.reward == 1.0


def test_a_failed_planner_is_not_followed_by_its_executor(monkeypatch: pytest.MonkeyPatch) -> None:
    async def broken_reset(self: object) -> list[Message]:
        raise RuntimeError("no question today")

    monkeypatch.setattr("harmonyrl.tasks.relay.PlannerEnv.reset", broken_reset)
    engine, trajectories = run(group_requests(TASKS[:1], 2, base_seed=0))
    assert engine.prompts == []  # neither role generated
    assert len(trajectories) == 4 and all(t.failure is not None and t.failure.kind == "env_error" for t in trajectories)
    assert "earlier role" in str(trajectories[1].failure)


def test_per_role_metrics_and_handoff() -> None:
    _, trajectories = run(group_requests(TASKS, 1, base_seed=0))
    metrics = role_metrics(TEAM, trajectories)
    assert metrics["team/planner/episodes"] == metrics["team/executor/episodes"] == 4.0
    assert metrics["team/planner/reward"] == metrics["team/executor/reward"] == 0.75
    assert metrics["team/planner/tool_call_rate"] == 0.0 and metrics["team/executor/tool_call_rate"] == 0.75
    assert metrics["team/planner/turns"] == 1.0 and metrics["team/executor/turns"] == 1.75
    assert handoff(trajectories[0]) == f"Compute {expression_of(TASKS[0])}"
    assert role_metrics(TEAM.role_factory(1), trajectories) == {}  # a single-agent factory has no roles
