"""Calculator: the default environment. Multi-step integer arithmetic plus an exact calculator tool.

The problems (``347 * 28 + 1191``) are easy with the tool and near-impossible for a tiny model "in its
head", so the reward signal is really about learning *to call the tool and copy its result*.
:func:`expert_demo` writes imperfect demonstrations (it sometimes guesses instead of calling the tool, and
sometimes wraps the right number in a sentence the grader rejects) so that SFT leaves room for RL.

Splits are disjoint by construction: a problem's split is a hash of its canonical key (commutative operands
sorted, so ``28 * 347 + 1191`` and ``347 * 28 + 1191`` are the same problem), independent of the seed. Task
generation is prefix-stable: the first k tasks of a split do not depend on ``n_train`` / ``n_test``.
"""

from __future__ import annotations

import ast
import hashlib
import json
import operator
import random
import re
import warnings
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Literal, NamedTuple

from harmonyrl.envs.tools import Tool, Toolbox, observation
from harmonyrl.envs.turns import ToolTurns, final_answer
from harmonyrl.types import Message, StepResult, Task, ToolSpec

_MAX_EXPR_CHARS = 200
_MAX_EXPONENT = 64
_MAX_BITS = 1024  # |values| up to ~1e308: far beyond the tasks, small enough that no input is slow

_OPS: dict[type[ast.operator], Callable[[Fraction, Fraction], Fraction | int]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


class CalculatorError(ValueError):
    """A bad expression: the model's fault, reported to it as ``{"error": ...}``."""


def _bits(x: Fraction) -> int:
    return max(x.numerator.bit_length(), x.denominator.bit_length())


def _check_power(base: Fraction, exponent: Fraction) -> None:
    # Checked *before* computing: 9**9**9 must be refused, not attempted.
    if exponent.denominator != 1 or abs(exponent) > _MAX_EXPONENT:
        raise CalculatorError(f"exponent must be an integer with |exponent| <= {_MAX_EXPONENT}")
    if _bits(base) * abs(exponent) > _MAX_BITS:
        raise CalculatorError("result too large")


def _eval(node: ast.AST) -> Fraction:
    # Exact rationals: ``/`` must not lose digits the model is graded on.
    match node:
        case ast.Constant(value=int() as v) if not isinstance(v, bool):  # True is an int in Python
            return Fraction(v)
        case ast.Constant():
            raise CalculatorError("only integer numbers are supported")
        case ast.UnaryOp(op=ast.USub(), operand=x):
            return -_eval(x)
        case ast.UnaryOp(op=ast.UAdd(), operand=x):
            return _eval(x)
        case ast.BinOp(left=left, op=op, right=right) if type(op) in _OPS:
            a, b = _eval(left), _eval(right)
            if isinstance(op, ast.Pow):
                _check_power(a, b)
            result = Fraction(_OPS[type(op)](a, b))
            if _bits(result) > _MAX_BITS:
                raise CalculatorError("result too large")
            return result
        case _:
            raise CalculatorError(f"unsupported syntax: {type(node).__name__}")


def evaluate(expression: str) -> Fraction:
    """Safely evaluate integer arithmetic (+ - * / // % **, parentheses, unary minus). No names, no calls."""
    if len(expression) > _MAX_EXPR_CHARS:
        raise CalculatorError(f"expression longer than {_MAX_EXPR_CHARS} characters")
    try:
        with warnings.catch_warnings():  # e.g. "5and" warns before failing; the model sees the error, not stderr
            warnings.simplefilter("ignore", SyntaxWarning)
            tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise CalculatorError(f"invalid expression: {getattr(e, 'msg', None) or e}") from None
    try:
        return _eval(tree.body)
    except ZeroDivisionError:
        raise CalculatorError("division by zero") from None


def calculator(expression: str) -> str:
    """Evaluate integer arithmetic exactly.

    Args:
        expression: For example "347 * 28 + 1191".
    """
    try:
        value = evaluate(expression)
    except CalculatorError as e:
        return json.dumps({"error": str(e)})
    return json.dumps({"result": value.numerator if value.denominator == 1 else float(value)})


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
_TEST_BUCKETS = 5  # out of 100: ~5% of problem space is test-only, for every seed
_EXPR_RE = re.compile(r"[\d(][\d+\-*() ]*[\d)]")  # templates contain no digits, so this is the expression


def split_of(key: str) -> Literal["train", "test"]:
    bucket = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") % 100
    return "test" if bucket < _TEST_BUCKETS else "train"


def generate_tasks(seed: int, n_train: int, n_test: int) -> tuple[tuple[Task, ...], tuple[Task, ...]]:
    """(train, test). Every draw consumes the same randomness whether kept or not (prefix stability)."""
    rng = random.Random(seed)
    out: dict[Literal["train", "test"], list[Task]] = {"train": [], "test": []}
    want = {"train": n_train, "test": n_test}
    seen: set[str] = set()
    for _ in range(100 * (n_train + n_test) + 1000):
        if all(len(out[s]) >= want[s] for s in out):
            return tuple(out["train"]), tuple(out["test"])
        shape, template = rng.choice(SHAPES), rng.choice(TEMPLATES)
        problem = shape(rng)
        split = split_of(problem.key)
        if problem.key in seen or len(out[split]) >= want[split]:
            continue
        seen.add(problem.key)
        task_id = f"calculator-{seed}-{split}-{len(out[split]):05d}"
        prompt = template.format(expr=problem.expression)
        out[split].append(Task(id=task_id, prompt=prompt, answer=str(problem.value), split=split))
    raise RuntimeError(f"could not draw {n_train} train + {n_test} test distinct problems")


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

    def __init__(self, seed: int = 0, n_train: int = 20_000, n_test: int = 500, tool_timeout_s: float = 5.0) -> None:
        if n_train < 0 or n_test < 0:
            raise ValueError("n_train and n_test must be >= 0")
        self.seed = seed
        self._train, self._test = generate_tasks(seed, n_train, n_test)
        # One immutable tool + toolbox shared by every episode: schema derivation is done once.
        self._toolbox = Toolbox([Tool.from_function(calculator, timeout_s=tool_timeout_s)])

    def tasks(self, split: Literal["train", "test"]) -> Sequence[Task]:
        return self._train if split == "train" else self._test

    def make(self, task: Task) -> CalculatorEnv:
        return CalculatorEnv(task, self._toolbox)


# ---- scripted expert ---------------------------------------------------------------------------------


def guess_answer(answer: int, rng: random.Random) -> str:
    """A plausible mental-arithmetic answer: right magnitude, wrong digits (or rounded)."""
    digits = list(str(abs(answer)))
    if rng.random() < 0.3 and len(digits) > 2:
        guess = round(abs(answer), -rng.choice((1, 2)))
    else:
        for i in rng.sample(range(len(digits)), k=min(len(digits), rng.choice((1, 2)))):
            lowest = 1 if i == 0 and len(digits) > 1 else 0  # keep the leading digit non-zero
            digits[i] = rng.choice([d for d in "0123456789"[lowest:] if d != digits[i]])
        guess = int("".join(digits))
    return str(-guess if answer < 0 else guess)


VERBOSE_TEMPLATES = ("The answer is {}.", "The result is {}.", "{} is the answer.")
"""What a chatty expert writes instead of "only the number": the instructions forbid it, the grader rejects it."""


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
    expr = expression_of(task)
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
