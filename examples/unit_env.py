"""A complete custom environment with a tool: unit conversion. Check it with
``harmonyrl check-env examples/unit_env.py:UnitFactory``."""

from harmonyrl.envs.tools import Tool, Toolbox
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
        self.task, self.box, self.tools = task, toolbox, toolbox.specs

    async def reset(self) -> list[Message]:
        return [Message("user", self.task.prompt)]

    async def step(self, action: list[Message]) -> StepResult:
        last = action[-1] if action else None
        if last is not None and self.box.handles(last):
            result = await self.box.dispatch(last)  # bad arguments come back as an observation for the model
            return StepResult(observations=(result.observation,) if result.observation else (), failure=result.failure)
        correct = last is not None and last.channel == "final" and last.content.strip() == self.task.answer
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
