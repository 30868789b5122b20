"""pass@k against values derived by hand and against brute force over every k-subset."""

from __future__ import annotations

import itertools
import math
import random
from fractions import Fraction

import pytest

from harmonyrl.telemetry.passk import mean_pass_at_k, pass_at_k


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (6, 1, 2, 1 / 3),  # 1 - C(5,2)/C(6,2) = 1 - 10/15
        (10, 3, 5, 11 / 12),  # 1 - C(7,5)/C(10,5) = 1 - 21/252
        (4, 1, 1, 0.25),  # k = 1 is the plain success rate c/n
        (8, 3, 1, 3 / 8),
        (5, 0, 3, 0.0),  # no correct sample: never passes
        (5, 5, 1, 1.0),  # all correct
        (4, 2, 3, 1.0),  # C(2,3) = 0: every 3-subset of 4 holds one of the 2 correct samples
        (3, 1, 3, 1.0),  # k = n: passes iff any sample is correct
        (3, 0, 3, 0.0),
    ],
)
def test_closed_form_values(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_matches_brute_force_over_all_k_subsets() -> None:
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 9)
        c = rng.randint(0, n)
        k = rng.randint(1, n)
        correct = [True] * c + [False] * (n - c)
        rng.shuffle(correct)
        subsets = list(itertools.combinations(correct, k))
        brute = sum(any(s) for s in subsets) / len(subsets)
        assert pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12), (n, c, k)


@pytest.mark.parametrize(("n", "c", "k"), [(1000, 10, 100), (10_000, 5_000, 50), (2_000, 1, 1_999)])
def test_stable_for_large_n(n: int, c: int, k: int) -> None:
    # exact rational reference; C(10000, 50) is far beyond float range, the product form never forms it
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-12, abs=1e-15)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((3, 1, 4), "k=4 needs at least k samples"),
        ((3, 4, 1), "c=4 correct samples cannot exceed n=3"),
        ((-1, 0, 1), "n must be >= 0"),
        ((3, -1, 1), "c must be >= 0"),
        ((3, 1, -2), "k must be >= 0"),
        ((3, 1, 0), "k must be >= 1"),
        ((3, True, 1), "c must be an int"),
        ((3.0, 1, 1), "n must be an int"),
    ],
)
def test_bad_input_is_a_clear_value_error(args: tuple[int, int, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        pass_at_k(*args)


def test_mean_over_tasks_and_keys_limited_by_fewest_samples() -> None:
    # task A: 1 of 4 correct, task B: 2 of 4.
    # pass@1 = (1/4 + 2/4) / 2 = 0.375
    # pass@2 = ((1 - C(3,2)/C(4,2)) + (1 - C(2,2)/C(4,2))) / 2 = (1/2 + 5/6) / 2 = 2/3
    # pass@8 cannot be measured from 4 samples, so it is left out.
    tasks = [[True, False, False, False], [False, True, True, False]]
    out = mean_pass_at_k(tasks, [8, 2, 1, 2])
    assert list(out) == ["pass@1", "pass@2"]
    assert out["pass@1"] == pytest.approx(0.375)
    assert out["pass@2"] == pytest.approx(2 / 3)


def test_mean_with_uneven_sample_counts() -> None:
    # the 1-sample task limits k to 1: pass@1 = (1 + 1/3) / 2
    out = mean_pass_at_k([[True], [False, False, True]], (1, 2))
    assert out == {"pass@1": pytest.approx(2 / 3)}


@pytest.mark.parametrize(
    ("tasks", "ks", "message"),
    [
        ([], [1], "no tasks"),
        ([[True], []], [1], "a task has no samples"),
        ([[True]], [0], "k must be >= 1"),
        ([[True]], [-1], "k must be >= 0"),
    ],
)
def test_mean_bad_input(tasks: list[list[bool]], ks: list[int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        mean_pass_at_k(tasks, ks)
