"""The instruct grader under attack: answers that meet constraints by saying nothing score 0.

Before the "is it a response" rule (grader at main) the empty answer, a prompt echo, ``1`` under "wrap in
JSON", ``A`` under "capital letters" and the bare closing phrase under "end with" each scored 1 below.
"""

from __future__ import annotations

import asyncio

import pytest

from harmonyrl.envs.reward import RewardWeights
from harmonyrl.tasks.constraints import Constraint as C
from harmonyrl.tasks.instruct import InstructFactory, render_prompt
from harmonyrl.types import Message, StepResult, Task

SKY = "Describe the night sky."
QUIET = [C("max_words", n=35), C("no_commas"), C("forbid_word", words=("very",))]  # "" met all three
TASKS = {
    "quiet": Task("q", render_prompt(SKY, QUIET), "x", "train"),
    "short": Task("s", render_prompt(SKY, [C("max_words", n=35), C("no_commas")]), "x", "train"),
    "json": Task("j", render_prompt(SKY, [C("json"), C("max_words", n=35)]), "x", "train"),
    "caps": Task("c", render_prompt(SKY, [C("uppercase")]), "x", "train"),
    "end": Task("e", render_prompt(SKY, [C("end_with", phrase="That is all.")]), "x", "train"),
    "file": Task("f", render_prompt("Write a haiku about rain.", [C("no_commas")]), "x", "train"),
}
STARS = "the night sky is dark and full of quiet stars tonight"  # 11 words, names night and sky


def grade(task: str, answer: str) -> StepResult:
    factory = InstructFactory(n_train=1, n_test=1, weights=RewardWeights(outcome=0.5, format=0.5))

    async def go() -> StepResult:
        env = factory.make(TASKS[task])
        await env.reset()
        return await env.step([Message("assistant", answer, channel="final")])

    return asyncio.run(go())


@pytest.mark.parametrize(
    ("task", "answer", "reward", "not_a_response"),
    [
        ("quiet", "", 0.0, 1.0),  # 0 words: at main, 1.0 (every constraint held)
        ("quiet", "  \n\t ", 0.0, 1.0),
        ("short", TASKS["short"].prompt, 0.0, 1.0),  # the prompt echoed: at main, 1.0 (13 words, no comma)
        ("short", TASKS["short"].prompt.upper() + "\n" + TASKS["short"].prompt, 0.0, 1.0),
        (
            "short",
            "Describe the night sky. I went out and looked up for a while tonight.",
            0.0,
            1.0,
        ),  # topic only copied
        ("short", "sky night sky night sky night sky night", 0.0, 1.0),  # 8 words, 2 different
        ("short", "The market was loud with traders selling fruit all day long.", 0.0, 1.0),  # off topic
        ("json", "1", 0.0, 1.0),  # valid JSON: at main, 1.0
        ("json", '{"response": "ok"}', 0.0, 1.0),
        ("caps", "A", 0.0, 1.0),  # upper case: at main, 1.0
        ("end", "That is all.", 0.0, 1.0),  # the exact ending alone: at main, 1.0
        ("file", "rain rain rain", 0.0, 1.0),  # a task file's free-text request: the length rules still apply
        # responses: full reward, or partial credit for the constraints met
        ("quiet", STARS, 1.0, 0.0),
        ("json", f'{{"response": "{STARS}"}}', 1.0, 0.0),
        ("caps", STARS.upper(), 1.0, 0.0),
        ("end", f"{STARS}. That is all.", 1.0, 0.0),
        ("quiet", f"{STARS}, very much so", 0.5 * 1 / 3, 0.0),  # comma and "very": 1 of 3 met, no outcome
        ("file", "soft rain taps the roof while the town sleeps", 1.0, 0.0),  # no topic words for free text
        # the documented limit: a keyword salad naming the topic is a response
        ("short", "night sky bright silence memory window river golden", 1.0, 0.0),
    ],
)
def test_answers(task: str, answer: str, reward: float, not_a_response: float) -> None:
    result = grade(task, answer)
    assert result.terminated and result.failure is None
    assert (result.reward, result.info["not_a_response"]) == (pytest.approx(reward), not_a_response)
    assert result.info["correct"] == float(reward == 1.0)


def test_a_tool_call_after_the_answer_is_a_harness_error() -> None:
    factory = InstructFactory(n_train=1, n_test=1)

    async def go() -> None:
        env = factory.make(TASKS["quiet"])
        await env.reset()
        assert (await env.step([Message("assistant", STARS, channel="final")])).reward == 1.0
        call = Message("assistant", "{}", channel="commentary", recipient="functions.x", content_type="json")
        with pytest.raises(RuntimeError, match="after the episode terminated"):
            await env.step([call])

    asyncio.run(go())
