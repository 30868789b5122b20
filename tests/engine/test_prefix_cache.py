"""The engine's prefix store: longest match, byte budget, least recently used eviction; prefill call grouping."""

from __future__ import annotations

import pytest
import torch

from harmonyrl.engine.local.kv_cache import KVSnapshot
from harmonyrl.engine.local.prefix_cache import CachedPrefix, PrefixCache, prefill_groups


def entry(tokens: int) -> CachedPrefix:
    """``tokens`` positions of 1 layer × 1 head × 2 dims: 8 bytes per position for keys, 8 for values."""
    zeros = (torch.zeros(1, tokens, 2),)
    return CachedPrefix(KVSnapshot(zeros, zeros, tokens), None)


def test_longest_stored_prefix_that_the_prompt_extends() -> None:
    cache = PrefixCache(10_000)
    cache.put((1, 2), entry(2))
    cache.put((1, 2, 3, 4), entry(4))
    cache.put((9, 9, 9), entry(3))
    hit = cache.longest([1, 2, 3, 4, 5])
    assert hit is not None and hit[0] == (1, 2, 3, 4)
    hit = cache.longest([1, 2, 3, 4])  # equal to a key: it must extend it by a token, so the shorter one
    assert hit is not None and hit[0] == (1, 2)
    assert cache.longest([1, 3, 4]) is None and cache.longest([]) is None


def test_byte_budget_evicts_least_recently_used_first() -> None:
    cache = PrefixCache(3 * entry(10).nbytes)  # room for three 10-token entries
    for first in (1, 2, 3):
        cache.put((first,) * 10, entry(10))
    assert cache.longest([1] * 11) is not None  # a hit makes (1,)*10 the most recently used
    cache.put((4,) * 10, entry(10))
    assert cache.keys() == [(3,) * 10, (1,) * 10, (4,) * 10] and cache.nbytes == 3 * entry(10).nbytes
    cache.put((3,) * 10, entry(10))  # storing a key again refreshes it, no double count
    assert cache.keys()[-1] == (3,) * 10 and len(cache) == 3 and cache.nbytes == 3 * entry(10).nbytes
    cache.put((5,) * 40, entry(40))  # larger than the whole budget: not stored, nothing evicted
    assert len(cache) == 3 and (5,) * 40 not in cache
    cache.clear()
    assert len(cache) == 0 and cache.nbytes == 0 and cache.longest([1] * 11) is None


def test_a_negative_budget_is_an_error() -> None:
    with pytest.raises(ValueError, match="budget"):
        PrefixCache(-1)


@pytest.mark.parametrize(
    ("lengths", "groups"),
    [
        ([5, 7, 6], [[0, 1, 2]]),  # similar tails: one call
        ([150, 5, 5, 5], [[0, 1], [2, 3]]),  # 2 x 150 <= 2 x 155; a third row would pad 2 x 150 tokens
        ([1, 40, 2, 39], [[0, 1, 2, 3]]),  # 4 x 40 = 160 <= 2 x 82
        ([40, 1, 1, 1, 1], [[0, 1], [2, 3, 4]]),
        ([], []),
    ],
)
def test_padding_groups_keep_padding_at_most_half(lengths: list[int], groups: list[list[int]]) -> None:
    assert prefill_groups(lengths) == groups
    for group in groups:
        width = max(lengths[i] for i in group)
        assert len(group) * width <= 2 * sum(lengths[i] for i in group) or len(group) == 1
