"""Reward composition: hand-derived values, validation, and the terms an AnswerEnv episode logs."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence

import pytest

from harmonyrl.envs.reward import AnswerEnv, RewardTerms, RewardWeights, compose_reward, exact_match, is_bare
from harmonyrl.envs.tools import Tool, Toolbox
from harmonyrl.types import Message, StepResult, Task

TERMS = {"outcome": 1.0, "format": 1.0, "tool_use": 1.0, "step_cost": -2.0}


def test_dense_composition_by_hand() -> None:
    weights = {"outcome": 0.8, "format": 0.1, "tool_use": 0.1, "step_cost": 0.05}
    reward, parts = compose_reward(TERMS, weights)
    # 0.8 * 1 + 0.1 * 1 + 0.1 * 1 + 0.05 * -2 = 0.9
    assert reward == pytest.approx(0.9)
    assert parts == pytest.approx(
        {"reward/outcome": 0.8, "reward/format": 0.1, "reward/tool_use": 0.1, "reward/step_cost": -0.1}
    )


def test_sparse_is_the_outcome_alone_and_unweighted_terms_are_logged_as_zero() -> None:
    reward, parts = compose_reward({"outcome": 0.0, "format": 1.0, "step_cost": -3.0}, {"outcome": 1.0})
    assert reward == 0.0
    assert parts == {"reward/outcome": 0.0, "reward/format": 0.0, "reward/step_cost": -0.0}
    assert compose_reward({"outcome": 1.0}, {"outcome": 1.0}) == (1.0, {"reward/outcome": 1.0})


def test_total_is_clipped_to_the_unit_interval() -> None:
    # a wrong 3-turn answer with a step cost: 0 + 0.05 * -3 = -0.15 -> 0 (never below the range)
    assert compose_reward({"outcome": 0.0, "step_cost": -3.0}, {"outcome": 1.0, "step_cost": 0.05})[0] == 0.0
    # raw weights above 1 (RewardWeights refuses them, compose_reward alone still keeps the range): 2 -> 1
    assert compose_reward({"outcome": 1.0}, {"outcome": 2.0})[0] == 1.0


def test_unknown_weight_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"unknown reward term\(s\) \['outcom'\]; known: \['format', 'outcome'\]"):
        compose_reward({"outcome": 1.0, "format": 0.0}, {"outcom": 1.0})
    with pytest.raises(ValueError, match="not finite"):
        compose_reward({"outcome": math.inf}, {"outcome": 1.0})


def test_weights_are_validated() -> None:
    assert RewardWeights().as_dict() == {"outcome": 1.0, "format": 0.0, "tool_use": 0.0, "step_cost": 0.0}
    RewardWeights(outcome=0.8, format=0.1, tool_use=0.1, step_cost=0.5)  # sums to exactly 1: fine
    with pytest.raises(ValueError, match=r"outcome \+ format \+ tool_use must sum to <= 1, got 1\.1"):
        RewardWeights(outcome=1.0, format=0.1)
    with pytest.raises(ValueError, match=r"step_cost must be a finite number >= 0, got -0\.1"):
        RewardWeights(step_cost=-0.1)
    with pytest.raises(ValueError, match="format must be a finite number"):
        RewardWeights(format=math.nan)
    terms = RewardTerms(outcome=1.0, format=0.0, tool_use=1.0, step_cost=-2.0)
    assert set(terms.as_dict()) == set(RewardWeights().as_dict())  # every term has a weight and vice versa


@pytest.mark.parametrize(
    ("answer", "content", "exact", "bare"),
    [("42", "42", True, True), ("42", " 42.\n", True, True), ("42", "41", False, True), ("42", "-7", False, True),
     ("42", "The answer is 42.", False, False), ("42", "42!", False, False), ("42", "", False, False),
     ("Lyon", "Lyon", True, True), ("Lyon", "Porto", False, True), ("Lyon", "It is Lyon", False, False),
     ("Oak Desk", "Oak Desk", True, True), ("Oak Desk", "a\nb", False, False)],
)  # fmt: skip
def test_exact_and_bare(answer: str, content: str, exact: bool, bare: bool) -> None:
    assert (exact_match(answer, content), is_bare(answer, content)) == (exact, bare)


def echo(text: str) -> str:
    """Echo the text back.

    Args:
        text: Anything.
    """
    return text


TASK = Task(id="t", prompt="Say 42.", answer="42", split="train")
CALL = [Message("assistant", '{"text": "42"}', channel="commentary", recipient="functions.echo", content_type="json")]


def final(text: str, channel: str = "final") -> list[Message]:
    return [Message("assistant", text, channel=channel)]  # type: ignore[arg-type]


def play(actions: Sequence[list[Message]], weights: RewardWeights) -> list[StepResult]:
    async def go() -> list[StepResult]:
        env = AnswerEnv(TASK, Toolbox([Tool.from_function(echo)]), "Say it.", weights)
        assert await env.reset() == [Message("user", "Say 42.")]
        return [await env.step(a) for a in actions]

    return asyncio.run(go())


DENSE = RewardWeights(outcome=0.7, format=0.2, tool_use=0.1, step_cost=0.05)


@pytest.mark.parametrize(
    ("actions", "weights", "reward", "terms"),
    [
        # default weights: reward == correct, whatever else happened
        ([CALL, final("42")], RewardWeights(), 1.0, (1.0, 0.0, 0.0, -0.0)),
        ([final("The answer is 42")], RewardWeights(), 0.0, (0.0, 0.0, 0.0, -0.0)),
        # dense: 0.7 + 0.2 + 0.1 - 2 * 0.05 = 0.9
        ([CALL, final("42")], DENSE, 0.9, (0.7, 0.2, 0.1, -0.1)),
        # right and bare without the tool, one turn: 0.7 + 0.2 + 0 - 0.05 = 0.85
        ([final("42")], DENSE, 0.85, (0.7, 0.2, 0.0, -0.05)),
        # the right number in a sentence is not the answer: 0 + 0 + 0 - 0.05 -> clipped to 0
        ([final("The answer is 42.")], DENSE, 0.0, (0.0, 0.0, 0.0, -0.05)),
        # bare but wrong after a tool call: 0 + 0.2 + 0.1 - 0.1 = 0.2
        ([CALL, final("41")], DENSE, 0.2, (0.0, 0.2, 0.1, -0.1)),
        # on the wrong channel: only the step cost, clipped to 0
        ([final("42", channel="analysis")], DENSE, 0.0, (0.0, 0.0, 0.0, -0.05)),
    ],
)
def test_answer_env_logs_each_term(
    actions: list[list[Message]], weights: RewardWeights, reward: float, terms: tuple[float, ...]
) -> None:
    *first, last = play(actions, weights)
    assert all(r.info == {"tool_error": 0.0} and not r.terminated for r in first)
    assert last.terminated and not last.truncated and last.failure is None
    assert last.reward == pytest.approx(reward)
    names = ("outcome", "format", "tool_use", "step_cost")
    assert [last.info[f"reward/{n}"] for n in names] == pytest.approx(list(terms))
    assert last.info["correct"] == float(
        exact_match("42", actions[-1][0].content) and actions[-1][0].channel == "final"
    )
    assert last.info["format_error"] == float(actions[-1][0].channel != "final")
    assert (last.info["tool_calls"], last.info["turns"]) == (float(len(first)), float(len(actions)))


def test_step_after_termination_raises() -> None:
    with pytest.raises(RuntimeError, match="terminated"):
        play([final("42"), final("42")], RewardWeights())
