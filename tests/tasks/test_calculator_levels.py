"""Calculator difficulty levels (``env.levels``): the usual shapes with L digits added to the last operand, reported per
task; without levels, the tasks are unchanged."""

from __future__ import annotations

import random
import re
from collections import Counter

import pytest

from harmonyrl.config import ConfigError, load_config
from harmonyrl.tasks.arith import evaluate
from harmonyrl.tasks.calculator import CalculatorFactory, expert_demo, expression_of, generate_tasks

LEVELLED = CalculatorFactory(seed=0, n_train=600, n_test=60, levels=(0, 5), test_levels=(4, 5))


def test_a_level_l_problem_widens_the_last_operand_by_l_digits() -> None:
    for task in LEVELLED.tasks("train"):
        expr = expression_of(task)
        level = LEVELLED.difficulty(task)
        assert level is not None and 0 <= level <= 5
        numbers = re.findall(r"\d+", expr)
        assert 3 <= len(numbers) <= 4  # the usual shapes: 3 or 4 operands
        # the other operands keep the usual shapes' 2-3 digits (every shape's first operand has at least 2)
        assert all(2 <= len(n) <= 3 for n in numbers[:-1])
        # the last operand: 1-4 digits in the usual shapes (3..19 to 100..9999), plus L
        assert 1 + level <= len(numbers[-1]) <= 4 + level
        assert str(evaluate(expr)) == task.answer


def test_levels_are_spread_and_the_held_out_split_is_the_hard_end() -> None:
    train = Counter(LEVELLED.difficulty(t) for t in LEVELLED.tasks("train"))
    assert set(train) == {0, 1, 2, 3, 4, 5} and min(train.values()) > 50  # ~100 of each of 600
    assert {LEVELLED.difficulty(t) for t in LEVELLED.tasks("test")} == {4, 5}
    train_exprs = {expression_of(t) for t in LEVELLED.tasks("train")}
    assert not train_exprs & {expression_of(t) for t in LEVELLED.tasks("test")}


def test_levelled_generation_is_prefix_stable_and_the_expert_solves_it() -> None:
    small = CalculatorFactory(seed=0, n_train=50, n_test=5, levels=(0, 5), test_levels=(4, 5))
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
        (["env.levels=[0,7]"], "highest <= 6"),
        (["env.test_levels=[1,2]"], "env.test_levels needs env.levels"),
        (["rl.curriculum.start_levels=1"], "reports task difficulty"),
        (["env.name=maze", "rl.curriculum.start_levels=1"], "reports task difficulty"),
    ],
)
def test_bad_level_settings_are_one_line_config_errors(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        load_config(None, overrides)
    assert "\n" not in str(caught.value)
