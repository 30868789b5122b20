"""``env.operand_values=N``: the usual calculator shapes with every operand among the lowest N values of its range
(fewer distinct number tokens, for a warm start with a 201k vocabulary); unset, the tasks are unchanged."""

from __future__ import annotations

import re

import pytest

from harmonyrl.config import ConfigError, load_config
from harmonyrl.tasks.arith import evaluate
from harmonyrl.tasks.calculator import CalculatorFactory, expression_of, generate_tasks
from harmonyrl.tasks.factory import make_factory


def test_without_the_knob_the_tasks_are_todays() -> None:
    # Drawn with the code before the knob existed (seed 0): the default stream must not move.
    train, test = generate_tasks(0, 3, 1)
    assert [(t.prompt, t.answer) for t in train] == [
        ("Evaluate 15 * 43 * 7.", "4515"),
        ("Compute 74 * 27 + 46 * 4.", "2182"),
        ("What does 828 * 42 + 8825 equal?", "43601"),
    ]
    assert test[0].prompt == "Evaluate 48 * 71 * 5."
    assert generate_tasks(0, 30, 5, None) == generate_tasks(0, 30, 5)


def test_every_operand_is_among_the_lowest_n_of_its_range() -> None:
    factory = CalculatorFactory(seed=0, n_train=600, n_test=60, operand_values=10)
    # the shapes' ranges start at 10 (two-digit), 100 (three-digit) and 3 (the small factor)
    allowed = {*range(10, 20), *range(100, 110), *range(3, 13)}
    seen: set[int] = set()
    for task in (*factory.tasks("train"), *factory.tasks("test")):
        expr = expression_of(task)
        numbers = {int(n) for n in re.findall(r"\d+", expr)}
        assert numbers <= allowed, expr
        seen |= numbers
        assert str(evaluate(expr)) == task.answer
    assert len(seen) > 20  # narrowed, not collapsed: most of the 32 allowed values occur
    train_exprs = {expression_of(t) for t in factory.tasks("train")}
    assert not train_exprs & {expression_of(t) for t in factory.tasks("test")}


def test_the_config_field_reaches_the_factory() -> None:
    cfg = load_config(None, ["env.operand_values=10", "env.n_train=50", "env.n_test=5"])
    factory = make_factory(cfg.env, cfg.seed)
    assert factory.tasks("train") == CalculatorFactory(cfg.seed, 50, 5, operand_values=10).tasks("train")
    assert max(int(n) for t in factory.tasks("train") for n in re.findall(r"\d+", expression_of(t))) <= 109


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["env.operand_values=1"], "greater than or equal to 2"),
        (["env.operand_values=10", "env.levels=[0,1]"], "cannot be set with env.levels"),
    ],
)
def test_bad_operand_settings_are_one_line_config_errors(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        load_config(None, overrides)
    assert "\n" not in str(caught.value)
