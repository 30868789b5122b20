"""The pure parts of a torchrun launch: who holds which rows, the global normaliser, and the launch checks."""

from __future__ import annotations

import pytest
import torch

from harmonyrl.algorithms.losses import AggregationMode, aggregate_loss, aggregation_units
from harmonyrl.distributed.world import SINGLE, LaunchError, World, join, launched_size, most_rows, shard_rows


def test_rows_are_split_contiguously_and_completely() -> None:
    assert shard_rows(5, World(0, 2)).tolist() == [0, 1, 2]
    assert shard_rows(5, World(1, 2)).tolist() == [3, 4]
    assert shard_rows(1, World(1, 2)).tolist() == []  # a rank may hold nothing: it runs zero-weighted passes
    assert shard_rows(4, SINGLE).tolist() == [0, 1, 2, 3]
    assert [most_rows(n, World(0, 2)) for n in (1, 4, 5)] == [1, 2, 3]


def test_aggregation_units_by_hand() -> None:
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    assert float(aggregation_units(mask, "token-mean")) == 3.0  # 2 + 0 + 1 tokens
    for mode in ("seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        assert float(aggregation_units(mask, mode)) == 2.0  # the empty row is no sequence


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_shards_weighted_by_the_global_normaliser_sum_to_the_whole(mode: AggregationMode) -> None:
    # per-token losses 1..6 over rows of 2, 1 and 3 tokens, split 2 rows / 1 row as two ranks would hold them
    loss = torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    # by hand: token-mean 21/6 = 3.5; seq-mean-token-sum (3 + 3 + 15)/3 = 7; seq-mean-token-mean (1.5 + 3 + 5)/3
    # = 19/6; seq-mean-token-sum-norm 7/10 with norm 10
    expected = {"token-mean": 3.5, "seq-mean-token-sum": 7.0, "seq-mean-token-mean": 19 / 6,
                "seq-mean-token-sum-norm": 0.7}[mode]  # fmt: skip
    whole = aggregation_units(mask, mode)
    parts = [slice(0, 2), slice(2, 3)]
    total = sum(
        aggregate_loss(loss[p], mask[p], mode, norm=10.0) * aggregation_units(mask[p], mode) / whole for p in parts
    )
    assert float(total) == pytest.approx(expected)
    assert float(aggregate_loss(loss, mask, mode, norm=10.0)) == pytest.approx(expected)


def test_a_plain_process_is_the_single_world_and_a_broken_launch_is_one_line() -> None:
    assert join({}) == SINGLE and join({"WORLD_SIZE": "1"}) == SINGLE
    with pytest.raises(LaunchError, match="not a positive integer"):
        launched_size({"WORLD_SIZE": "two"})
    with pytest.raises(LaunchError, match="MASTER_ADDR, MASTER_PORT unset"):
        join({"WORLD_SIZE": "2", "RANK": "0"})
