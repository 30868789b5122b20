"""Calculator: the default environment. Multi-step integer arithmetic plus an exact calculator tool.

The problems (``347 * 28 + 1191``) are easy with the tool and near-impossible for a tiny model "in its
head", so the reward signal is really about learning *to call the tool and copy its result*.
:func:`expert_demo` writes imperfect demonstrations (it sometimes guesses instead of calling the tool, and
sometimes wraps the right number in a sentence the grader rejects) so that SFT leaves room for RL.

Splits are disjoint by construction: a problem's split is a hash of its canonical key (commutative operands
sorted, so ``28 * 347 + 1191`` and ``347 * 28 + 1191`` are the same problem), independent of the seed. Task
generation is prefix-stable: the first k tasks of a split do not depend on ``n_train`` / ``n_test``.
The ``n_val`` validation problems are drawn afterwards from a stream of their own, posed like the held-out ones
(``test_levels``, ``operand_values``), from the train part of the key space and none of the run's train problems
(:func:`harmonyrl.envs.taskfile.draw_validation`): train and test are what they were before validation existed.

**Difficulty levels** (``env.levels``, for curricula: docs/curriculum.md). With ``levels=(lo, hi)`` every
problem gets a level L drawn uniformly from ``lo..hi``: one of the five shapes with L random digits appended to
its last operand (level 0 is the shape itself), so a harder problem has a longer number to copy into the tool and
a longer result to copy out, in the layout the default warm start learned. One operand, not every one: the warm
start copies numbers only as long as those it was trained on, and one digit more on every operand was a cliff
(0 % from the warm start) where one digit more on the last operand is not (docs/curriculum.md). The factory
reports each task's level (:meth:`CalculatorFactory.difficulty`). Widened problems are keyed by their text.

**Fewer distinct operands** (``env.operand_values=N``): every operand takes one of the lowest N values of its usual
range (``a * b + c`` with a, b in 10..19 and c in 100..109 for N=10), so each number token recurs often: a warm
start with a 201k vocabulary, where each number is its own id, sees each one many times (docs/o200k.md).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Sequence
from typing import Literal, NamedTuple

from harmonyrl.envs.taskfile import Splits, draw_validation, split_of, validation_rng
from harmonyrl.envs.tools import Tool, Toolbox, observation
from harmonyrl.envs.turns import ToolTurns, final_answer
from harmonyrl.tasks.arith import calculator, evaluate
from harmonyrl.tasks.guesses import VERBOSE_TEMPLATES, guess_answer
from harmonyrl.types import Message, Split, StepResult, Task, ToolSpec

# ---- tasks -------------------------------------------------------------------------------------------


class Problem(NamedTuple):
    expression: str
    key: str  # canonical: commutative operands sorted, so the split cannot be leaked by reordering
    value: int  # computed directly (not via ``evaluate``): task generation must be fast


Shape = Callable[[random.Random], Problem]


def _mul_add(r: random.Random) -> Problem:
    a, b, c = r.randint(10, 999), r.randint(10, 99), r.randint(100, 9999)
    return Problem(f"{a} * {b} + {c}", f"ma:{sorted((a, b))}:{c}", a * b + c)


def _mul_sub(r: random.Random) -> Problem:
    a, b, c = r.randint(10, 999), r.randint(10, 99), r.randint(100, 9999)
    return Problem(f"{a} * {b} - {c}", f"ms:{sorted((a, b))}:{c}", a * b - c)


def _sum_mul(r: random.Random) -> Problem:
    a, b, c = r.randint(100, 999), r.randint(100, 999), r.randint(3, 19)
    return Problem(f"({a} + {b}) * {c}", f"sm:{sorted((a, b))}:{c}", (a + b) * c)


def _mul_mul(r: random.Random) -> Problem:
    a, b, c = r.randint(10, 99), r.randint(10, 99), r.randint(3, 9)
    return Problem(f"{a} * {b} * {c}", f"mm:{sorted((a, b, c))}", a * b * c)


def _two_products(r: random.Random) -> Problem:
    a, b, c, d = r.randint(10, 99), r.randint(10, 99), r.randint(10, 99), r.randint(3, 9)
    key = f"pp:{sorted([sorted((a, b)), sorted((c, d))])}"
    return Problem(f"{a} * {b} + {c} * {d}", key, a * b + c * d)


SHAPES: tuple[Shape, ...] = (_mul_add, _mul_sub, _sum_mul, _mul_mul, _two_products)
TEMPLATES = (
    "What is {expr}?",
    "Compute {expr}.",
    "Calculate {expr}.",
    "Evaluate {expr}.",
    "What does {expr} equal?",
    "Find the value of {expr}.",
)
_EXPR_RE = re.compile(r"[\d(][\d+\-*() ]*[\d)]")  # templates contain no digits, so this is the expression


class _Narrowed(random.Random):
    """``randint(a, b)`` draws from the lowest ``n`` values of ``a..b`` only; every other draw is ``Random``'s."""

    def __init__(self, seed: int | str, n: int) -> None:
        super().__init__(seed)
        self.n = n

    def randint(self, a: int, b: int) -> int:
        return super().randint(a, min(b, a + self.n - 1))


def generate_tasks(
    seed: int, n_train: int, n_test: int, operand_values: int | None = None
) -> tuple[tuple[Task, ...], tuple[Task, ...]]:
    """(train, test). Every draw consumes the same randomness whether kept or not (prefix stability).
    ``operand_values``: each operand takes one of the lowest N values of its range (None: the whole range)."""
    train, test, _ = _generate(seed, n_train, n_test, operand_values)
    return train, test


def _draw_problem(rng: random.Random) -> tuple[str, Callable[[], tuple[str, str]]]:
    """A :data:`~harmonyrl.envs.taskfile.Draw` of the usual problems (the validation split's)."""
    shape, template = rng.choice(SHAPES), rng.choice(TEMPLATES)
    problem = shape(rng)
    return problem.key, lambda: (template.format(expr=problem.expression), str(problem.value))


def generate_three(seed: int, n_train: int, n_val: int, n_test: int, operand_values: int | None = None) -> Splits:
    """:func:`generate_tasks`' train and test, and ``n_val`` validation problems drawn like them (module doc)."""
    train, test, keys = _generate(seed, n_train, n_test, operand_values)
    stream = f"calculator:{seed}:validation"
    rng = validation_rng("calculator", seed) if operand_values is None else _Narrowed(stream, operand_values)
    return Splits(train, draw_validation("calculator", seed, n_val, rng, _draw_problem, keys, str), test)


def _generate(
    seed: int, n_train: int, n_test: int, operand_values: int | None
) -> tuple[tuple[Task, ...], tuple[Task, ...], set[str]]:
    """(train, test, their canonical keys)."""
    rng = random.Random(seed) if operand_values is None else _Narrowed(seed, operand_values)
    out: dict[Literal["train", "test"], list[Task]] = {"train": [], "test": []}
    want = {"train": n_train, "test": n_test}
    seen: set[str] = set()
    for _ in range(100 * (n_train + n_test) + 1000):
        if all(len(out[s]) >= want[s] for s in out):
            return tuple(out["train"]), tuple(out["test"]), seen
        shape, template = rng.choice(SHAPES), rng.choice(TEMPLATES)
        problem = shape(rng)
        split = split_of(problem.key)
        if problem.key in seen or len(out[split]) >= want[split]:
            continue
        seen.add(problem.key)
        task_id = f"calculator-{seed}-{split}-{len(out[split]):05d}"
        prompt = template.format(expr=problem.expression)
        out[split].append(Task(id=task_id, prompt=prompt, answer=str(problem.value), split=split))
    raise RuntimeError(f"could not draw {n_train} train + {n_test} test distinct problems: lower env.n_train")


def _widened(r: random.Random, level: int) -> Problem:
    """One of the five shapes with ``level`` random digits appended to its last operand (level 0: the shape)."""
    base = r.choice(SHAPES)(r)
    if level == 0:
        return base
    # every shape's text ends with its last operand, so appending to the text widens that operand
    text = base.expression + "".join(r.choice("0123456789") for _ in range(level))
    return Problem(text, f"w{level}:{text}", int(evaluate(text)))


def generate_levelled(
    seed: int, n_train: int, n_val: int, n_test: int, levels: tuple[int, int], test_levels: tuple[int, int]
) -> tuple[Splits, dict[str, int]]:
    """(the splits, level of each task id): problems with a level drawn from ``levels`` (train) or
    ``test_levels`` (held out: test and validation); prefix-stable like :func:`generate_tasks`."""
    train, test, level_of, keys = _levelled(seed, n_train, n_test, levels, test_levels)
    drawn: list[int] = []

    def draw(rng: random.Random) -> tuple[str, Callable[[], tuple[str, str]]]:
        level, template = rng.randint(*test_levels), rng.choice(TEMPLATES)
        problem = _widened(rng, level)

        def make() -> tuple[str, str]:  # called once per kept problem, in order: its level is the next one
            drawn.append(level)
            return template.format(expr=problem.expression), str(problem.value)

        return problem.key, make

    validation = draw_validation("calculator", seed, n_val, validation_rng("calculator", seed), draw, keys, str)
    level_of.update((task.id, level) for task, level in zip(validation, drawn, strict=True))
    return Splits(train, validation, test), level_of


def _levelled(
    seed: int, n_train: int, n_test: int, levels: tuple[int, int], test_levels: tuple[int, int]
) -> tuple[tuple[Task, ...], tuple[Task, ...], dict[str, int], set[str]]:
    """(train, test, level of each task id, their canonical keys)."""
    rng = random.Random(seed)
    ranges = {"train": levels, "test": test_levels}
    lo, hi = min(levels[0], test_levels[0]), max(levels[1], test_levels[1])
    out: dict[Literal["train", "test"], list[Task]] = {"train": [], "test": []}
    want = {"train": n_train, "test": n_test}
    level_of: dict[str, int] = {}
    seen: set[str] = set()
    for _ in range(100 * (n_train + n_test) + 1000):
        if all(len(out[s]) >= want[s] for s in out):
            return tuple(out["train"]), tuple(out["test"]), level_of, seen
        level, template = rng.randint(lo, hi), rng.choice(TEMPLATES)
        problem = _widened(rng, level)
        split = split_of(problem.key)
        first, last = ranges[split]
        if problem.key in seen or len(out[split]) >= want[split] or not first <= level <= last:
            continue
        seen.add(problem.key)
        task_id = f"calculator-{seed}-{split}-{len(out[split]):05d}"
        prompt = template.format(expr=problem.expression)
        out[split].append(Task(id=task_id, prompt=prompt, answer=str(problem.value), split=split))
        level_of[task_id] = level
    raise RuntimeError(f"could not draw {n_train} train + {n_test} test distinct problems at levels {levels}")


def expression_of(task: Task) -> str:
    match = _EXPR_RE.search(task.prompt)
    if match is None:
        raise ValueError(f"no arithmetic expression in {task.prompt!r}")
    return match.group(0)


def is_correct(answer: str, content: str) -> bool:
    """Exact match, tolerating only surrounding whitespace and one trailing period."""
    text = content.strip()
    return (text[:-1] if text.endswith(".") else text) == answer


# ---- environment -------------------------------------------------------------------------------------

INSTRUCTIONS = (
    "Solve the arithmetic problem. Use the calculator tool to compute it. "
    "Then answer on the final channel with only the number."
)


class CalculatorEnv:
    """One episode. Terminal ``info`` always has the same keys so batch means are well defined."""

    def __init__(self, task: Task, toolbox: Toolbox) -> None:
        self.task = task
        self._episode = ToolTurns(toolbox)

    @property
    def tools(self) -> Sequence[ToolSpec]:
        return self._episode.toolbox.specs

    @property
    def instructions(self) -> str:
        return INSTRUCTIONS

    async def reset(self) -> list[Message]:
        self._episode.reset()
        return [Message(role="user", content=self.task.prompt)]

    async def step(self, action: Sequence[Message]) -> StepResult:
        if (tool_turn := await self._episode.step(action)) is not None:
            return tool_turn
        answer = final_answer(action)
        if answer is None:
            return StepResult(reward=0.0, terminated=True, info=self._terms(correct=False, format_error=True))
        correct = is_correct(self.task.answer, answer)
        return StepResult(reward=float(correct), terminated=True, info=self._terms(correct, False))

    def _terms(self, correct: bool, format_error: bool) -> dict[str, float]:
        return {
            "correct": float(correct),
            "format_error": float(format_error),
            "tool_calls": float(self._episode.tool_calls),
        }

    async def close(self) -> None:
        self._episode.done = True


class CalculatorFactory:
    name = "calculator"

    def __init__(
        self,
        seed: int = 0,
        n_train: int = 20_000,
        n_test: int = 500,
        tool_timeout_s: float = 5.0,
        levels: tuple[int, int] | None = None,
        test_levels: tuple[int, int] | None = None,
        operand_values: int | None = None,
        n_val: int = 0,
    ) -> None:
        if n_train < 0 or n_test < 0 or n_val < 0:
            raise ValueError("n_train, n_val and n_test must be >= 0")
        self.seed = seed
        self._levels: dict[str, int] = {}
        if levels is None:
            self._splits = generate_three(seed, n_train, n_val, n_test, operand_values)
        else:
            self._splits, self._levels = generate_levelled(seed, n_train, n_val, n_test, levels, test_levels or levels)
        # One immutable tool + toolbox shared by every episode: schema derivation is done once.
        self._toolbox = Toolbox([Tool.from_function(calculator, timeout_s=tool_timeout_s)])

    def tasks(self, split: Split) -> Sequence[Task]:
        return self._splits.of(split)

    def make(self, task: Task) -> CalculatorEnv:
        return CalculatorEnv(task, self._toolbox)

    def difficulty(self, task: Task) -> int | None:
        """The task's level (digits added to the last operand) with ``levels`` set; None without."""
        return self._levels.get(task.id)


# ---- scripted expert ---------------------------------------------------------------------------------


def expert_demo(task: Task, rng: random.Random, p_tool: float = 0.8, p_verbose: float = 0.0) -> list[Message]:
    """The assistant side (plus tool results) of a demonstration following ``reset()``'s messages.

    Two deliberate, independent imperfections leave RL something to learn:

    * with probability ``1 - p_tool`` the expert skips the tool and guesses (wrong, plausible);
    * with probability ``p_verbose`` a tool-using expert wraps the correct number in a sentence
      (:data:`VERBOSE_TEMPLATES`), which the instructions forbid and the exact-match grader scores 0.

    The second one costs the warm start no copying practice (the number is still copied from the tool
    result), which is what a tiny model needs most; skipping the tool does (a guess copies nothing).
    No analysis channel: short sequences for a tiny model. JSON uses ``json.dumps`` defaults, so what the
    expert writes is exactly what the model should learn to write.
    """
    if rng.random() >= p_tool:
        return [Message(role="assistant", channel="final", content=guess_answer(int(task.answer), rng))]
    return tool_then_answer(expression_of(task), rng, p_verbose)


def tool_then_answer(expr: str, rng: random.Random, p_verbose: float) -> list[Message]:
    """The calculator called on ``expr``, its result, then the number as the final answer — wrapped in a sentence
    (:data:`VERBOSE_TEMPLATES`) with probability ``p_verbose``: the tool-using part of a demonstration."""
    call = Message(
        role="assistant",
        channel="commentary",
        recipient="functions.calculator",
        content_type="json",
        content=json.dumps({"expression": expr}),
    )
    result = calculator(expr)
    value = str(json.loads(result)["result"])
    verbose = p_verbose > 0 and rng.random() < p_verbose  # p_verbose 0 draws nothing: older demo streams stay
    answer = rng.choice(VERBOSE_TEMPLATES).format(value) if verbose else value
    return [call, observation("calculator", result), Message(role="assistant", channel="final", content=answer)]
