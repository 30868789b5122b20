"""A complete custom environment with a tool: unit conversion. Check it with
``harmonyrl check-env examples/unit_env.py:UnitFactory``."""

from harmonyrl.envs.tools import Tool, Toolbox
from harmonyrl.envs.turns import ToolTurns, final_answer
from harmonyrl.types import Message, StepResult, Task

FACTORS = {"km": 1000.0, "m": 1.0, "cm": 0.01, "mile": 1609.344}


def convert(value: float, unit: str, to: str) -> str:
    """Convert a length between units.

    Args:
        value: The number to convert.
        unit: Its unit, one of km, m, cm, mile.
        to: The target unit.
    """
    return f"{value * FACTORS[unit] / FACTORS[to]:.2f}"


class UnitEnv:
    instructions = "Use the convert tool, then answer on the final channel with only the number."

    def __init__(self, task: Task, toolbox: Toolbox) -> None:
        self.task, self.tools = task, toolbox.specs
        self.turns = ToolTurns(toolbox)  # tool calls -> observations (or masked env failures), counted

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
    name = "units"

    def __init__(self) -> None:
        self.box = Toolbox([Tool.from_function(convert, timeout_s=2.0)])
        pairs = [(v, u, t) for v in range(1, 60) for u in FACTORS for t in FACTORS if u != t]
        self._tasks = [
            Task(f"units-{i}", f"How many {t} is {v} {u}?", convert(v, u, t), "test" if i % 10 == 0 else "train")
            for i, (v, u, t) in enumerate(pairs)
        ]

    def tasks(self, split: str) -> list[Task]:
        return [t for t in self._tasks if t.split == split]

    def make(self, task: Task) -> UnitEnv:
        return UnitEnv(task, self.box)
