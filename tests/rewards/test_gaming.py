"""The gaming verdict on hand-made curves: proxy rising while true success falls, beyond the noise."""

from __future__ import annotations

import math

import pytest

from harmonyrl.rewards.gaming import gaming_verdict, proportion_trend, trend


def test_trend_hand_values() -> None:
    # first 3: [0, 1, 2] mean 1, var 1; last 3: [4, 5, 6] mean 5, var 1; change 4, stderr sqrt(1/3 + 1/3) = 0.8165
    t = trend([0, 1, 2, 9, 4, 5, 6], window=3)
    assert t is not None
    assert (t.start, t.end, t.change) == (1.0, 5.0, 4.0)
    assert t.stderr == pytest.approx(math.sqrt(2 / 3))
    assert t.direction == "rises"  # 4 > 2 · 0.8165


def test_trend_within_noise_is_flat() -> None:
    # first [0, 1] mean 0.5 var 0.5; last [0, 2] mean 1 var 2; change 0.5 < 2 · sqrt(0.25 + 1) = 2.24
    t = trend([0, 1, 0, 2], window=2)
    assert t is not None and t.direction == "flat"
    # the same change with z = 0.3: 0.5 > 0.3 · 1.118 = 0.335
    t = trend([0, 1, 0, 2], window=2, z=0.3)
    assert t is not None and t.direction == "rises"


def test_trend_noiseless_and_constant() -> None:
    assert (t := trend([1, 1, 0, 0], window=2)) is not None and t.direction == "falls"  # stderr 0, change -1
    assert (t := trend([3, 3, 3, 3], window=2)) is not None and t.direction == "flat"


def test_trend_skips_nan_and_needs_two_windows() -> None:
    t = trend([math.nan, 0, 0, math.nan, 1, 1], window=2)
    assert t is not None and (t.start, t.end) == (0.0, 1.0)
    assert trend([0, 1, math.nan], window=2) is None
    with pytest.raises(ValueError, match="window"):
        trend([0, 1], window=1)  # no variance in one point: no noise estimate


def test_gaming_verdicts() -> None:
    up, down, noise = [0, 0, 0, 1, 1, 1], [1, 1, 1, 0, 0, 0], [0, 1, 0, 1, 0, 1]
    assert gaming_verdict(up, down, window=3).verdict == "gamed"
    assert gaming_verdict(up, up, window=3).verdict == "not gamed"  # truth follows the proxy
    assert gaming_verdict(down, down, window=3).verdict == "not gamed"  # proxy falls too: a bad policy, not gaming
    assert gaming_verdict(up, noise, window=3).verdict == "not gamed"  # truth within noise
    short = gaming_verdict(up[:5], down, window=3)
    assert short.verdict == "too short" and short.proxy is None and short.truth is not None


def test_proportion_trend_hand_values() -> None:
    # 0.5 of 100 → 0.3 of 100: pooled 0.4, stderr sqrt(0.4 · 0.6 · (1/100 + 1/100)) = 0.06928; change -0.2 = -2.89 se
    t = proportion_trend(0.5, 100, 0.3, 100)
    assert t.stderr == pytest.approx(math.sqrt(0.0048)) and t.change == pytest.approx(-0.2)
    assert t.direction == "falls"
    assert proportion_trend(0.5, 10, 0.3, 10).direction == "flat"  # se 0.219: within noise on 10 episodes
    assert proportion_trend(0.0, 5, 0.0, 5).direction == "flat"
    with pytest.raises(ValueError, match="episode counts"):
        proportion_trend(0.5, 0, 0.3, 10)


def test_held_out_fall_alone_is_gaming() -> None:
    up, noise = [0, 0, 0, 1, 1, 1], [0, 1, 0, 1, 0, 1]
    fell = proportion_trend(0.5, 100, 0.3, 100)
    got = gaming_verdict(up, noise, window=3, held_out=fell)
    assert got.verdict == "gamed" and got.truth is not None and got.truth.direction == "flat"
    assert gaming_verdict(up, noise, window=3, held_out=proportion_trend(0.5, 100, 0.5, 100)).verdict == "not gamed"
    assert gaming_verdict(noise, noise, window=3, held_out=fell).verdict == "not gamed"  # proxy flat: not gaming
