"""A complete custom environment with a tool, and an expert for the SFT warm start: unit conversion.

The tutorial (docs/custom-env.md) walks through it. Check it with
``harmonyrl check-env examples/unit_env.py:UnitFactory``; train on it with
``harmonyrl train env.name=custom env.factory=examples/unit_env.py:UnitFactory sft.expert=examples/unit_env.py:expert``.
"""

import json
import random
import re

from harmonyrl.envs.tools import Tool, Toolbox, observation
from harmonyrl.envs.turns import ToolTurns, final_answer
from harmonyrl.types import Message, StepResult, Task

FACTORS = {"km": 1000.0, "mile": 1609.344, "m": 1.0, "yard": 0.9144, "foot": 0.3048}
PAIRS = [("km", "mile"), ("mile", "km"), ("m", "yard"), ("yard", "m"), ("m", "foot"), ("foot", "m"),
         ("yard", "foot"), ("foot", "yard")]  # fmt: skip
"""Conversions between units of similar size: every answer has at most 6 characters (``3277.6``), short enough
for the tutorial's 1.3 M-parameter model to copy from the tool's result (see docs/custom-env.md, Measured)."""


def convert(value: float, unit: str, to: str) -> str:
    """Convert a length between units.

    Args:
        value: The number to convert.
        unit: Its unit, one of km, mile, m, yard, foot.
        to: The target unit.
    """
    return f"{value * FACTORS[unit] / FACTORS[to]:.1f}"


class UnitEnv:
    instructions = "Use the convert tool, then answer on the final channel with only the number."

    def __init__(self, task: Task, toolbox: Toolbox) -> None:
        self.task, self.tools = task, toolbox.specs
        self.turns = ToolTurns(toolbox)  # tool calls (a KeyError on a bad unit too) -> observations, counted

    async def reset(self) -> list[Message]:
        self.turns.reset()
        return [Message("user", self.task.prompt)]

    async def step(self, action: list[Message]) -> StepResult:
        if (tool_turn := await self.turns.step(action)) is not None:
            return tool_turn
        answer = final_answer(action)  # None unless the model answered on the final channel
        correct = answer is not None and answer.strip() == self.task.answer
        return StepResult(reward=float(correct), terminated=True, info={"correct": float(correct)})

    async def close(self) -> None: ...


class UnitFactory:
    """Every (value, unit pair) with ``0 < value < max_value``; every 10th is held out."""

    name = "units"

    def __init__(self, max_value: int = 100) -> None:
        self.box = Toolbox([Tool.from_function(convert, timeout_s=2.0)])
        pairs = [(v, u, t) for v in range(1, max_value) for u, t in PAIRS]
        self._tasks = [
            Task(f"units-{i}", f"Convert {v} {u} to {t}.", convert(v, u, t), "test" if i % 10 == 0 else "train")
            for i, (v, u, t) in enumerate(pairs)
        ]

    def tasks(self, split: str) -> list[Task]:
        return [t for t in self._tasks if t.split == split]

    def make(self, task: Task) -> UnitEnv:
        return UnitEnv(task, self.box)


QUESTION = re.compile(r"Convert (\d+) (\w+) to (\w+)\.")


def expert(task: Task, rng: random.Random) -> list[Message]:
    """A demonstration for the SFT warm start: call ``convert``, then answer with its result.

    Imperfect on purpose, so that RL has something to learn: 1 in 5 answers is a guess made without the tool,
    and 3 in 10 tool-using answers are a sentence ("It is 3.1 mile.") that the exact-match grader scores 0.
    """
    value, unit, to = QUESTION.fullmatch(task.prompt).groups()  # type: ignore[union-attr]  # our own prompts
    if rng.random() < 0.2:
        return [Message("assistant", f"{float(task.answer) * rng.uniform(0.5, 1.5):.1f}", channel="final")]
    args = {"value": int(value), "unit": unit, "to": to}
    call = Message("assistant", json.dumps(args), "commentary", recipient="functions.convert", content_type="json")
    result = convert(**args)
    answer = f"It is {result} {to}." if rng.random() < 0.3 else result
    return [call, observation("convert", result), Message("assistant", answer, channel="final")]
