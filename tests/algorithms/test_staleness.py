"""The staleness-aware learning-rate factor: hand-derived values, exactly 1 when off or fresh, bad input refused."""

from __future__ import annotations

import pytest

from harmonyrl.algorithms.staleness import staleness_lr_scale


def test_hand_derived_values() -> None:
    assert staleness_lr_scale(2, 0.5) == 0.5  # 1 / (1 + 0.5·2)
    assert staleness_lr_scale(1, 0.25) == 0.8  # 1 / 1.25
    assert staleness_lr_scale(1, 1.0) == 0.5  # staleness-aware async-SGD: lr / (1 + τ)
    assert staleness_lr_scale(3, 1.0) == 0.25


def test_exactly_one_when_off_or_fresh() -> None:
    assert staleness_lr_scale(2, 0.0) == 1.0
    assert staleness_lr_scale(0, 0.7) == 1.0


@pytest.mark.parametrize(("staleness", "decay"), [(-1, 0.5), (1, -0.1)])
def test_negative_input_is_refused(staleness: float, decay: float) -> None:
    with pytest.raises(ValueError, match="must be >= 0"):
        staleness_lr_scale(staleness, decay)
