"""Scripted experts for the example verifiers environments (harmonyrl's SFT warm start: ``sft.expert``).

A verifiers taskset ships no demonstrations; these read each task's reference answer as the built-in experts do,
imperfect on purpose (a guess without the tool 1 time in 5; the right number in a sentence 3 times in 10), so RL
has something left to learn.
"""

import json
import random
import re

from harmonyrl.envs.tools import observation
from harmonyrl.tasks.guesses import VERBOSE_TEMPLATES, guess_answer
from harmonyrl.types import Message, Task

_EXPR = re.compile(r"What is (.+)\?")


def _final(task: Task, rng: random.Random, p_verbose: float) -> Message:
    text = rng.choice(VERBOSE_TEMPLATES).format(task.answer) if rng.random() < p_verbose else task.answer
    return Message("assistant", text, channel="final")


def sum_expert(task: Task, rng: random.Random, p_right: float = 0.8, p_verbose: float = 0.3) -> list[Message]:
    """vf_sum: the sum (or a plausible wrong one, or the sum in a sentence)."""
    if rng.random() >= p_right:
        return [Message("assistant", guess_answer(int(task.answer), rng), channel="final")]
    return [_final(task, rng, p_verbose)]


def max_expert(task: Task, rng: random.Random, p_right: float = 0.8, p_verbose: float = 0.3) -> list[Message]:
    """vf_max: the larger number (or, 1 time in 5, the smaller one; or the right one in a sentence)."""
    if rng.random() >= p_right:
        numbers = [int(n) for n in re.findall(r"\d+", task.prompt)]
        return [Message("assistant", str(min(numbers)), channel="final")]
    return [_final(task, rng, p_verbose)]


def calc_expert(task: Task, rng: random.Random, p_tool: float = 0.8, p_verbose: float = 0.3) -> list[Message]:
    """vf_calc: call ``calculate`` on the question's expression, then answer with its result."""
    if rng.random() >= p_tool:
        return [Message("assistant", guess_answer(int(task.answer), rng), channel="final")]
    match = _EXPR.search(task.prompt)
    expression = match.group(1) if match else task.prompt
    call = Message(
        "assistant",
        json.dumps({"expression": expression}),
        channel="commentary",
        recipient="functions.calculate",
        content_type="json",
    )
    return [call, observation("calculate", task.answer), _final(task, rng, p_verbose)]
