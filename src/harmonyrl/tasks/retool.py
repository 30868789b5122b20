"""Retool: multi-step math word problems, solved by writing a small Python program that runs in the sandbox.

    factory = RetoolFactory(seed=0)             # needs bubblewrap (or allow_unsafe=True)
    env = factory.make(factory.tasks("train")[0])

Problems are templated English over a handful of shapes (shopping change, rate × time, leftovers,
averages, two-leg distances, discounts, savings goals) with integer answers chosen so that mental arithmetic
is hopeless for a tiny model but a one-line program is exact. Each shape has one arithmetic expression that is
the single source of truth: the answer is that expression evaluated exactly
(:func:`harmonyrl.tasks.calculator.evaluate`), and the expert's program is ``print(<expression>)``.

The canonical key of a problem is its shape and numbers (commutative parts sorted), never its wording or the names in
it, so rephrasing cannot carry a held-out problem into train. Splits, validation (``n_val``, drawn after train and
test, which it leaves unchanged) and prefix stability come from :func:`harmonyrl.envs.taskfile.draw_three`.

Reward is the exact final answer (:class:`~harmonyrl.envs.reward.AnswerEnv`), optionally shaped by
:class:`~harmonyrl.envs.reward.RewardWeights`. Whatever the *code* does (a traceback, an infinite loop) is an
observation the model learns from; a sandbox that cannot start is ``Failure("sandbox_error")``, masked.
"""

from __future__ import annotations

import json
import math
import random
import re
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from harmonyrl.envs.python_tool import make_python_tool
from harmonyrl.envs.reward import OUTCOME_ONLY, AnswerEnv, RewardWeights
from harmonyrl.envs.taskfile import tasks_from
from harmonyrl.envs.tools import Toolbox, observation
from harmonyrl.errors import NotDemonstrable
from harmonyrl.sandbox import SandboxLimits
from harmonyrl.tasks.arith import evaluate
from harmonyrl.tasks.guesses import VERBOSE_TEMPLATES, guess_answer
from harmonyrl.types import Message, Split, Task

DEFAULT_LIMITS = SandboxLimits(timeout_s=5, cpu_s=5, memory_mib=256, max_processes=16, max_output_bytes=4096)
NAMES = ("Maya", "Omar", "Lena", "Ravi", "Sofia", "Kenji", "Amara", "Lucas", "Ines", "Tomas")
ITEMS = ("notebook", "pen", "mug", "candle", "ticket", "plant", "scarf", "lamp")
INSTRUCTIONS = (
    "Solve the word problem. Write a short Python program that prints the answer and run it with the python "
    "tool. Then answer on the final channel with only the number."
)

Fields = dict[str, int]


@dataclass(frozen=True)
class Shape:
    """One kind of problem: English phrasings, the exact expression, and how its numbers are drawn.

    ``templates`` use the numbers of ``draw`` once each, plus ``{name}`` / ``{item}`` / ``{item2}`` (surface
    words, not part of the key). ``draw`` returns the numbers and the canonical key.
    """

    name: str
    templates: tuple[str, ...]
    expr: str
    draw: Callable[[random.Random], tuple[Fields, str]]


def _shop(r: random.Random) -> tuple[Fields, str]:
    a, p, b, q = r.randint(2, 19), r.randint(3, 99), r.randint(2, 19), r.randint(3, 99)
    bill = ((a * p + b * q) // 100 + 1 + r.randint(0, 3)) * 100
    return {"a": a, "p": p, "b": b, "q": q, "bill": bill}, f"{sorted([(a, p), (b, q)])}:{bill}"


def _rate(r: random.Random) -> tuple[Fields, str]:
    rate, h, m = r.randint(12, 480), r.randint(1, 23), r.randint(1, 59)
    return {"r": rate, "h": h, "m": m}, f"{rate}:{h}:{m}"


def _leftover(r: random.Random) -> tuple[Fields, str]:
    a, b, k = r.randint(3, 60), r.randint(6, 48), r.randint(7, 29)
    return {"a": a, "b": b, "k": k}, f"{sorted((a, b))}:{k}"


def _average(r: random.Random) -> tuple[Fields, str]:
    xs = [r.randint(40, 999) for _ in range(5)]
    xs[4] += -sum(xs) % 5  # an integer mean, so "the average" has one exact answer
    return {f"x{i + 1}": x for i, x in enumerate(xs)}, f"{sorted(xs)}"


def _distance(r: random.Random) -> tuple[Fields, str]:
    t1, v1, t2, v2 = r.randint(2, 12), r.randint(40, 320), r.randint(2, 12), r.randint(40, 320)
    return {"t1": t1, "v1": v1, "t2": t2, "v2": v2}, f"{sorted([(t1, v1), (t2, v2)])}"


def _discount(r: random.Random) -> tuple[Fields, str]:
    d = r.choice((10, 15, 20, 25, 30, 40, 50, 75))
    step = 100 // math.gcd(d, 100)  # price * d / 100 is then a whole number of dollars
    p, n = step * r.randint(max(1, 20 // step), 900 // step), r.randint(2, 15)
    return {"p": p, "d": d, "n": n}, f"{p}:{d}:{n}"


def _savings(r: random.Random) -> tuple[Fields, str]:
    s, h = r.randint(7, 95), r.randint(10, 900)
    g = h + r.randint(200, 5000)
    return {"s": s, "h": h, "g": g}, f"{s}:{h}:{g}"


SHAPES: tuple[Shape, ...] = (
    Shape("shop", (
        "{name} buys {a} {item}s at {p} dollars each and {b} {item2}s at {q} dollars each, paying with {bill} "
        "dollars. How much change does {name} get, in dollars?",
        "{name} has {bill} dollars and buys {a} {item}s costing {p} dollars each and {b} {item2}s costing {q} "
        "dollars each. How many dollars are left?",
    ), "{bill} - ({a} * {p} + {b} * {q})", _shop),
    Shape("rate", (
        "A machine fills {r} bottles per minute. How many bottles does it fill in {h} hours and {m} minutes?",
        "A printer prints {r} pages per minute. How many pages does it print in {h} hours and {m} minutes?",
    ), "{r} * ({h} * 60 + {m})", _rate),
    Shape("leftover", (
        "A bakery bakes {a} trays of {b} cookies each and packs them in boxes of {k}. How many cookies are left "
        "over after filling as many boxes as possible?",
        "{name} has {a} bags with {b} marbles each and shares them equally among {k} friends, giving each as "
        "many as possible. How many marbles are left?",
    ), "({a} * {b}) % {k}", _leftover),
    Shape("average", (
        "{name}'s scores in five games were {x1}, {x2}, {x3}, {x4} and {x5}. What is the average score?",
        "Over five days a shop sold {x1}, {x2}, {x3}, {x4} and {x5} loaves of bread. On average, how many "
        "loaves did it sell per day?",
    ), "({x1} + {x2} + {x3} + {x4} + {x5}) // 5", _average),
    Shape("distance", (
        "A train travels {t1} hours at {v1} km per hour, then {t2} hours at {v2} km per hour. How many "
        "kilometres does it travel in total?",
        "{name} drives for {t1} hours at {v1} km per hour and then for {t2} hours at {v2} km per hour. What is "
        "the total distance in kilometres?",
    ), "{t1} * {v1} + {t2} * {v2}", _distance),
    Shape("discount", (
        "A {item} costs {p} dollars. During a sale the price drops by {d} percent. {name} buys {n} of them. "
        "How much does {name} pay, in dollars?",
        "{name} buys {n} {item}s in a sale that takes {d} percent off the usual price of {p} dollars each. "
        "What is the total cost in dollars?",
    ), "{n} * ({p} - {p} * {d} // 100)", _discount),
    Shape("savings", (
        "{name} has {h} dollars and saves {s} dollars every week. After how many weeks will {name} have at "
        "least {g} dollars?",
    ), "({g} - {h} + {s} - 1) // {s}", _savings),
)  # fmt: skip


def _draw(r: random.Random) -> tuple[str, Callable[[], tuple[str, str]]]:
    shape, name = r.choice(SHAPES), r.choice(NAMES)
    template = r.choice(shape.templates)
    item, item2 = r.sample(ITEMS, 2)
    fields, key = shape.draw(r)

    def make() -> tuple[str, str]:
        prompt = template.format(name=name, item=item, item2=item2, **fields)
        return prompt, str(evaluate(shape.expr.format(**fields)))

    return f"{shape.name}:{key}", make


def generate_tasks(seed: int, n_train: int, n_test: int) -> tuple[tuple[Task, ...], tuple[Task, ...]]:
    """(train, test): deterministic under ``seed``, prefix-stable, disjoint by canonical key."""
    splits = tasks_from("retool", seed, n_train, n_test, _draw, None)
    return splits.train, splits.test


@cache
def _patterns() -> tuple[tuple[re.Pattern[str], Shape], ...]:
    """Each template as a regex that recovers its numbers (surface words match anything)."""
    out = []
    for shape in SHAPES:
        for template in shape.templates:
            parts = []
            for literal, field, _, _ in string.Formatter().parse(template):
                parts.append(re.escape(literal))
                if field is not None:
                    parts.append(".+?" if field in ("name", "item", "item2") else rf"(?P<{field}>-?\d+)")
            out.append((re.compile("".join(parts)), shape))
    return tuple(out)


def program_of(task: Task) -> str:
    """The expert's program for a generated problem: ``print(<the shape's expression>)``."""
    for pattern, shape in _patterns():
        if m := pattern.fullmatch(task.prompt):
            return f"print({shape.expr.format(**m.groupdict())})"
    raise NotDemonstrable(f"not a generated retool problem (no template matches): {task.prompt[:80]!r}")


class RetoolFactory:
    """Retool tasks and one sandboxed ``python`` tool shared by every episode.

    Raises ``SandboxUnavailable`` at construction when bubblewrap cannot isolate here and ``allow_unsafe`` is
    False: a machine that cannot sandbox fails at set-up, not as a stream of masked episodes.
    """

    name = "retool"

    def __init__(
        self,
        seed: int = 0,
        n_train: int = 5000,
        n_test: int = 200,
        limits: SandboxLimits = DEFAULT_LIMITS,
        allow_unsafe: bool = False,
        weights: RewardWeights = OUTCOME_ONLY,
        tasks_file: str | Path | None = None,
        n_val: int = 0,
    ) -> None:
        self.seed = seed
        self.weights = weights
        self._splits = tasks_from(self.name, seed, n_train, n_test, _draw, tasks_file, n_val)
        self._toolbox = Toolbox([make_python_tool(limits, allow_unsafe=allow_unsafe)])

    def tasks(self, split: Split) -> Sequence[Task]:
        return self._splits.of(split)

    def make(self, task: Task) -> AnswerEnv:
        return AnswerEnv(task, self._toolbox, INSTRUCTIONS, self.weights)


def expert_demo(task: Task, rng: random.Random, p_tool: float = 0.8, p_verbose: float = 0.0) -> list[Message]:
    """The assistant side (plus the tool result) of a demonstration following ``reset()``'s messages.

    The same two imperfections as the calculator's expert, so SFT leaves room for RL: with probability
    ``1 - p_tool`` it guesses a plausible wrong number instead of running a program; with probability
    ``p_verbose`` a program-running expert wraps the right number in a sentence the grader scores 0.
    The observation is what the sandbox prints for ``print(<int>)`` (checked against the real sandbox in the
    tests), so building demos runs no code.
    """
    program = program_of(task)  # first: a task no template matches fails whichever branch the draw picks
    if rng.random() >= p_tool:
        return [Message(role="assistant", channel="final", content=guess_answer(int(task.answer), rng))]
    value = str(evaluate(program[len("print(") : -1]))
    call = Message(
        role="assistant",
        channel="commentary",
        recipient="functions.python",
        content_type="json",
        content=json.dumps({"code": program}),
    )
    result = observation("python", json.dumps({"status": "ok", "stdout": f"{value}\n"}))
    verbose = p_verbose > 0 and rng.random() < p_verbose  # p_verbose 0 draws nothing: demo streams stay put
    answer = rng.choice(VERBOSE_TEMPLATES).format(value) if verbose else value
    return [call, result, Message(role="assistant", channel="final", content=answer)]
