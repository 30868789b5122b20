"""Relay: the calculator task played by a team of two that needs both of its members.

* The **planner** sees the question but has no tools: a tiny model cannot do the arithmetic in its head, so it
  must write, on the final channel, an instruction for its teammate (the expression to compute).
* The **executor** has the calculator tool but never sees the question: its one user message is the planner's
  final message. It computes and answers on the final channel; that answer is graded exactly as the calculator
  env grades it, and the grade is the team's reward (both roles get it; credit assignment: docs/multiagent.md).

The tasks are the calculator's (same seed, same problems, same validation and held-out splits), so a single agent on
``env.name=calculator`` solves the very same problems: the benchmark's comparison (benchmarks/multiagent.py).

The two scripted experts are deliberately imperfect, like the calculator's, so that SFT teaches the protocol and
leaves RL something to learn: the planner sometimes guesses the answer instead of handing over the expression
(``p_plan``), the executor sometimes guesses instead of calling the tool (``p_tool``) or answers in a sentence
(``p_verbose``).
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

from harmonyrl.envs.base import Env, EnvFactory
from harmonyrl.envs.loader import UserCodeError
from harmonyrl.envs.team import RoleExpert
from harmonyrl.envs.turns import final_answer
from harmonyrl.tasks.calculator import CalculatorEnv, CalculatorFactory, expression_of, tool_then_answer
from harmonyrl.tasks.guesses import VERBOSE_TEMPLATES, guess_answer
from harmonyrl.types import Message, Split, StepResult, Task, ToolSpec

PLANNER_INSTRUCTIONS = (
    "You are the planner of a team of two. You have no tools. Your teammate, the executor, has a calculator "
    "but cannot see the question: it reads only your final message. "
    "Answer on the final channel with the instruction: Compute, then the expression."
)
EXECUTOR_INSTRUCTIONS = (
    "You are the executor of a team of two. The user message is your planner's instruction; you cannot see "
    "the question. Use the calculator tool to compute the expression it gives. "
    "Then answer on the final channel with only the number."
)
PLAN_TEMPLATE = "Compute {expr}"
"""What the expert planner hands over (kept short: every token of it is copied twice by a tiny model)."""
_NUMBER = re.compile(r"-?\d+")


def one_role_only(task: Task, rng: random.Random) -> list[Message]:
    """What a single-expert caller (``harmonyrl sft --export-demos``) gets for the team: a one-line refusal."""
    raise UserCodeError(
        "env.name=relay demonstrates each role with its own expert (sft/team_demos.py): "
        "exporting its demonstrations is not supported"
    )


class PlannerEnv:
    """The planner's episode: one turn, no tools. Its final message is the handoff; the reward comes from the
    executor (the harness fills in the team's reward), so this env's own reward is 0."""

    def __init__(self, task: Task) -> None:
        self.task = task

    @property
    def tools(self) -> Sequence[ToolSpec]:
        return ()

    @property
    def instructions(self) -> str:
        return PLANNER_INSTRUCTIONS

    async def reset(self) -> list[Message]:
        return [Message(role="user", content=self.task.prompt)]

    async def step(self, action: Sequence[Message]) -> StepResult:
        # A tool call (there are none) or a non-final message hands over nothing: the executor gets an empty note.
        handed_over = final_answer(action) is not None
        return StepResult(terminated=True, info={"handoff": float(handed_over)})

    async def close(self) -> None: ...


class ExecutorEnv:
    """The executor's episode: the calculator env over the task as the executor sees it (``task.prompt`` is the
    planner's message), with the executor's instructions."""

    def __init__(self, task: Task, solo: CalculatorEnv) -> None:
        self.task = task
        self._solo = solo

    @property
    def tools(self) -> Sequence[ToolSpec]:
        return self._solo.tools

    @property
    def instructions(self) -> str:
        return EXECUTOR_INSTRUCTIONS

    async def reset(self) -> list[Message]:
        return await self._solo.reset()

    async def step(self, action: Sequence[Message]) -> StepResult:
        return await self._solo.step(action)

    async def close(self) -> None:
        await self._solo.close()


class _RoleFactory:
    """One role's factory over the team's tasks (what the harness runs a role's episodes with)."""

    def __init__(self, team: RelayFactory, role: int) -> None:
        self.name = f"relay.{team.roles[role]}"
        self._team = team
        self._role = role

    def tasks(self, split: Split) -> Sequence[Task]:
        return self._team.tasks(split)

    def make(self, task: Task) -> Env:
        return self._team.make(task) if self._role == 0 else self._team.make_executor(task)


class RelayFactory:
    """The relay team (a :class:`~harmonyrl.envs.team.TeamFactory`): planner then executor."""

    name = "relay"
    roles: tuple[str, ...] = ("planner", "executor")

    def __init__(
        self,
        seed: int = 0,
        n_train: int = 20_000,
        n_test: int = 500,
        tool_timeout_s: float = 5.0,
        p_plan: float = 0.8,
        p_tool: float = 0.8,
        p_verbose: float = 0.3,
        n_val: int = 0,
    ) -> None:
        self._solo = CalculatorFactory(seed, n_train, n_test, tool_timeout_s, n_val=n_val)
        self._experts = (
            lambda task, rng: planner_demo(task, rng, p_plan),
            lambda task, rng: executor_demo(task, rng, p_tool, p_verbose),
        )

    def tasks(self, split: Split) -> Sequence[Task]:
        return self._solo.tasks(split)

    def make(self, task: Task) -> PlannerEnv:
        """The first role's env: the one that sees the task."""
        return PlannerEnv(task)

    def make_executor(self, task: Task) -> ExecutorEnv:
        """The executor's env over ``task`` as the executor sees it (its prompt is the planner's message)."""
        return ExecutorEnv(task, self._solo.make(task))

    def role_factory(self, role: int) -> EnvFactory:
        return _RoleFactory(self, role)

    def role_expert(self, role: int) -> RoleExpert:
        return self._experts[role]


# ---- scripted experts --------------------------------------------------------------------------------


def planner_demo(task: Task, rng: random.Random, p_plan: float = 0.8) -> list[Message]:
    """The planner's demonstration: the instruction ``Compute EXPR``; with probability ``1 - p_plan`` it
    guesses the answer instead ("The answer is 1234."), which its executor can only copy, wrongly."""
    if rng.random() >= p_plan:
        content = VERBOSE_TEMPLATES[0].format(guess_answer(int(task.answer), rng))
    else:
        content = PLAN_TEMPLATE.format(expr=expression_of(task))
    return [Message(role="assistant", channel="final", content=content)]


def executor_demo(task: Task, rng: random.Random, p_tool: float = 0.8, p_verbose: float = 0.3) -> list[Message]:
    """The executor's demonstration for ``task`` as it sees it (``task.prompt``: the planner's message).

    A plan with an expression: the calculator on it (with probability ``p_tool``, else a guess), then the number,
    wrapped in a sentence with probability ``p_verbose``. A plan without one (the planner guessed): the number the
    planner gave, copied (wrong, as the guess was), or a guess when there is no number either."""
    try:
        expr = expression_of(task)
    except ValueError:
        expr = None
    if expr is None or expr.lstrip("-").isdigit():
        number = _NUMBER.search(task.prompt)
        answer = number.group(0) if number else guess_answer(int(task.answer), rng)
        return [Message(role="assistant", channel="final", content=answer)]
    if rng.random() >= p_tool:
        return [Message(role="assistant", channel="final", content=guess_answer(int(task.answer), rng))]
    return tool_then_answer(expr, rng, p_verbose)
