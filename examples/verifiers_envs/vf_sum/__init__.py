"""vf_sum: add two numbers, one turn, no tools: a verifiers v1 environment as its users write one.

``pip install -e examples/verifiers_envs`` (or put the folder on ``PYTHONPATH``), then
``harmonyrl train env.name=verifiers env.id=vf_sum``.
"""

import random

import verifiers.v1 as vf


class SumData(vf.TaskData):
    answer: str
    """The sum, as digits."""


class SumTask(vf.Task[SumData]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        """1 when the reply is exactly the sum."""
        return float(trace.last_reply.strip() == self.data.answer)

    @vf.metric
    async def reply_chars(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply))


class SumConfig(vf.TasksetConfig):
    num_tasks: int = 2000
    """How many questions to build."""
    max_value: int = 50
    """Largest addend."""
    seed: int = 0


class SumTaskset(vf.Taskset[SumTask, SumConfig]):
    def load(self) -> list[SumTask]:
        rng = random.Random(self.config.seed)
        tasks, seen = [], set()
        while len(tasks) < self.config.num_tasks and len(seen) < (self.config.max_value + 1) ** 2:
            a, b = rng.randint(0, self.config.max_value), rng.randint(0, self.config.max_value)
            if (a, b) in seen:
                continue
            seen.add((a, b))
            data = SumData(
                prompt=f"What is {a} + {b}?",
                system_prompt="Reply with only the number.",
                answer=str(a + b),
            )
            tasks.append(SumTask(data, self.config.task))
        return tasks


__all__ = ["SumTaskset"]
