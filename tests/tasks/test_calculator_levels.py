"""Calculator difficulty levels (``env.levels``): chains of L operations, reported per task, defaults unchanged."""

from __future__ import annotations

import random
import re
from collections import Counter

import pytest

from harmonyrl.config import ConfigError, load_config
from harmonyrl.tasks.arith import evaluate
from harmonyrl.tasks.calculator import CalculatorFactory, _chain, expert_demo, expression_of, generate_tasks

LEVELLED = CalculatorFactory(seed=0, n_train=600, n_test=60, levels=(1, 6), level_digits=2, test_levels=(5, 6))


def test_a_level_l_problem_has_l_operations_over_two_digit_operands() -> None:
    for task in LEVELLED.tasks("train"):
        expr = expression_of(task)
        level = LEVELLED.difficulty(task)
        assert level is not None and 1 <= level <= 6
        assert len(re.findall(r" [+\-*] ", expr)) == level
        assert all(10 <= int(n) <= 99 for n in re.findall(r"\d+", expr))
        assert str(evaluate(expr)) == task.answer  # with precedence: 2 + 3 * 4 is 14


def test_chain_by_hand() -> None:
    problem = _chain(random.Random(0), 2, 1)  # two operations over one-digit operands
    assert len(problem.expression.split()) == 5
    assert problem.value == int(evaluate(problem.expression))


def test_levels_are_spread_and_the_held_out_split_is_the_hard_end() -> None:
    train = Counter(LEVELLED.difficulty(t) for t in LEVELLED.tasks("train"))
    assert set(train) == {1, 2, 3, 4, 5, 6} and min(train.values()) > 50  # ~100 of each of 600
    assert {LEVELLED.difficulty(t) for t in LEVELLED.tasks("test")} == {5, 6}
    train_exprs = {expression_of(t) for t in LEVELLED.tasks("train")}
    assert not train_exprs & {expression_of(t) for t in LEVELLED.tasks("test")}


def test_levelled_generation_is_prefix_stable_and_the_expert_solves_it() -> None:
    small = CalculatorFactory(seed=0, n_train=50, n_test=5, levels=(1, 6), test_levels=(5, 6))
    assert small.tasks("train") == LEVELLED.tasks("train")[:50]
    demo = expert_demo(LEVELLED.tasks("train")[0], random.Random(0), p_tool=1.0)
    assert demo[-1].content == LEVELLED.tasks("train")[0].answer


def test_without_levels_the_tasks_are_the_default_shapes_and_report_no_difficulty() -> None:
    factory = CalculatorFactory(seed=0, n_train=30, n_test=5)
    assert (tuple(factory.tasks("train")), tuple(factory.tasks("test"))) == generate_tasks(0, 30, 5)
    assert factory.difficulty(factory.tasks("train")[0]) is None


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["env.levels=[3,2]"], "lowest <= highest"),
        (["env.test_levels=[1,2]"], "env.test_levels needs env.levels"),
        (["rl.curriculum.start_levels=1"], "reports task difficulty"),
        (["env.name=maze", "rl.curriculum.start_levels=1"], "reports task difficulty"),
    ],
)
def test_bad_level_settings_are_one_line_config_errors(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        load_config(None, overrides)
    assert "\n" not in str(caught.value)
