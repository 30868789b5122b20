"""The statistics helper against hand-computed cases."""

from __future__ import annotations

import math

import pytest

from harmonyrl.telemetry.stats import (
    Estimate,
    clustered,
    difference,
    learned,
    mean_se,
    over_seeds,
    paired,
    proportion,
    spread,
    time_to_target,
)


def test_mean_se_of_independent_values() -> None:
    # 1, 2, 3, 4: mean 2.5, sample variance 5/3, SE sqrt(5/3 / 4)
    e = mean_se([1.0, 2.0, 3.0, 4.0])
    assert (e.mean, e.n, e.clusters) == (2.5, 4, 4)
    assert e.se == pytest.approx(math.sqrt(5 / 12))
    assert math.isnan(mean_se([0.7]).se)  # one value: no spread to estimate


def test_over_seeds_records_the_seeds() -> None:
    e = over_seeds({2: 0.5, 0: 0.3, 1: 0.4})
    assert e.seeds == (0, 1, 2)
    assert e.mean == pytest.approx(0.4)
    assert e.se == pytest.approx(0.1 / math.sqrt(3))  # sd of 0.3, 0.4, 0.5 is 0.1


def test_clustered_equal_sizes_is_the_se_of_the_cluster_means() -> None:
    # tasks of 4 samples: means 1, 0.5, 0 -> mean 0.5, SE = sd(1, .5, 0)/sqrt(3) = 0.5/sqrt(3)
    e = clustered([[1, 1, 1, 1], [1, 0, 1, 0], [0, 0, 0, 0]])
    assert (e.n, e.clusters) == (12, 3)
    assert e.mean == pytest.approx(0.5)
    assert e.se == pytest.approx(0.5 / math.sqrt(3))
    # the same 12 samples taken as independent would claim a smaller SE: sqrt(.25 · 12/11 / 12)
    assert mean_se([1, 1, 1, 1, 1, 0, 1, 0, 0, 0, 0, 0]).se == pytest.approx(math.sqrt(0.25 * 12 / 11 / 12))
    assert mean_se([1, 1, 1, 1, 1, 0, 1, 0, 0, 0, 0, 0]).se < e.se


def test_clustered_unequal_sizes_by_hand() -> None:
    # clusters [1, 1] and [0]: mean 2/3; residual sums 2/3 and -2/3; G/(G-1)=2 -> sqrt(2 · 8/9) / 3
    e = clustered([[1.0, 1.0], [0.0], []])
    assert e.mean == pytest.approx(2 / 3)
    assert e.clusters == 2
    assert e.se == pytest.approx(math.sqrt(2 * 8 / 9) / 3)


def test_clustered_with_one_sample_per_cluster_is_the_plain_se() -> None:
    values = [0.0, 1.0, 1.0, 0.0, 1.0]
    assert clustered([[v] for v in values]).se == pytest.approx(mean_se(values).se)


def test_proportion_difference_and_paired() -> None:
    p = proportion(30, 100)
    assert p.mean == pytest.approx(0.3)
    assert p.se == pytest.approx(math.sqrt(0.21 / 100))
    d = difference(Estimate(0.3, 0.03, 100, 100), Estimate(0.5, 0.04, 100, 100))
    assert d.mean == pytest.approx(0.2)
    assert d.se == pytest.approx(0.05)  # hypot(0.03, 0.04)
    # seeds shared by both arms: differences 0.1, 0.2, 0.3 -> mean 0.2, SE 0.1/sqrt(3); seed 9 is in one arm only
    e = paired({"0": 0.1, "1": 0.2, "2": 0.3, "9": 5.0}, {"0": 0.2, "1": 0.4, "2": 0.6})
    assert (e.mean, e.n) == (pytest.approx(0.2), 3)
    assert e.se == pytest.approx(0.1 / math.sqrt(3))
    with pytest.raises(ValueError, match="share no"):
        paired({"a": 1.0}, {"b": 1.0})
    assert paired({0: 0.1, 1: 0.2, 2: 0.3}, {0: 0.2, 1: 0.4, 2: 0.6}) == e  # seeds as ints: the same


@pytest.mark.parametrize(
    ("mean", "se", "expected"),
    [
        (0.15, 0.05, True),  # +15 points, 3 SE
        (0.15, 0.08, False),  # +15 points but under 2 SE (the rows the issue doubts)
        (0.10, 0.01, False),  # exactly +10 is not "more than"
        (0.09, 0.001, False),  # many SE, too small a gain
        (0.30, math.nan, False),  # no SE, no verdict
    ],
)
def test_learned_needs_ten_points_and_two_standard_errors(mean: float, se: float, expected: bool) -> None:
    assert learned(Estimate(mean, se, 400, 100)) is expected


def test_spread_and_time_to_target() -> None:
    s = spread([3.0, 1.0, 2.0, 10.0])
    assert (s.median, s.low, s.high, s.n) == (2.5, 1.0, 10.0, 4)
    curve = [(0.0, 0.30), (60.0, 0.36), (120.0, 0.46)]
    # target 0.40 lies 4/10 of the way from 0.36 to 0.46: 60 + 0.4·60 = 84 s, not the 120 s of the next evaluation
    assert time_to_target(curve, 0.40) == pytest.approx(84.0)
    assert time_to_target(curve, 0.25) == 0.0
    assert time_to_target(curve, 0.50) == math.inf


def test_result_fields_name_the_mean_and_its_se() -> None:
    """The RESULT line's pair: 0.1 and 0.3 → mean 0.2, SE = sd 0.1414 / √2 = 0.1; one value has no SE."""
    assert mean_se([0.1, 0.3]).fields("rl") == "rl=0.200 rl_se=0.100"
    assert mean_se([-6.0, -2.0]).fields("gap_pp", 1) == "gap_pp=-4.0 gap_pp_se=2.0"
    assert mean_se([0.25]).fields("one") == "one=0.250 one_se=nan"
