"""vf_max: the larger of two numbers, one turn, no tools: a verifiers v1 environment as its users write one.

``pip install -e examples/verifiers_envs`` (or put the folder on ``PYTHONPATH``), then
``harmonyrl train env.name=verifiers env.id=vf_max``. The reply must be the larger number and nothing else: the
smaller one, both, or the number in a sentence score 0.
"""

import random

import verifiers.v1 as vf


class MaxData(vf.TaskData):
    answer: str
    """The larger number, as digits."""
    smaller: str
    """The other one (what a careless reply copies)."""


class MaxTask(vf.Task[MaxData]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        """1 when the reply is exactly the larger number."""
        return float(trace.last_reply.strip() == self.data.answer)

    @vf.metric
    async def took_smaller(self, trace: vf.Trace) -> float:
        """1 when the reply is exactly the smaller number: the comparison went the wrong way."""
        return float(trace.last_reply.strip() == self.data.smaller)


class MaxConfig(vf.TasksetConfig):
    num_tasks: int = 2000
    """How many questions to build."""
    max_value: int = 99
    """Largest number asked about."""
    seed: int = 0


class MaxTaskset(vf.Taskset[MaxTask, MaxConfig]):
    def load(self) -> list[MaxTask]:
        rng = random.Random(self.config.seed)
        tasks, seen = [], set()
        pairs = (self.config.max_value + 1) * self.config.max_value
        while len(tasks) < self.config.num_tasks and len(seen) < pairs:
            a, b = rng.randint(0, self.config.max_value), rng.randint(0, self.config.max_value)
            if a == b or (a, b) in seen:
                continue
            seen.add((a, b))
            data = MaxData(
                prompt=f"Which is larger, {a} or {b}?",
                system_prompt="Reply with only the larger number.",
                answer=str(max(a, b)),
                smaller=str(min(a, b)),
            )
            tasks.append(MaxTask(data, self.config.task))
        return tasks


__all__ = ["MaxTaskset"]
