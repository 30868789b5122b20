"""Disjoint train / validation / test splits for procedurally generated tasks.

A generator seeded twice can draw the same question twice, so a split cannot be "the first n draws": a question's
split is a hash of its canonical key (the ecosystem's task name and the question's text), independent of the
seed, so the same question lands in the same split in every run and no held-out question is ever trained on.
10 % of the keys are test, 10 % validation, the rest train.
"""

from __future__ import annotations

import hashlib

from harmonyrl.types import Split

SPLITS: tuple[Split, ...] = ("train", "validation", "test")

_TEST_BUCKETS = 10
_VALIDATION_BUCKETS = 10


def three_way_split(key: str) -> Split:
    """The split of the question with canonical ``key`` (out of 100 hash buckets: 10 test, 10 validation)."""
    bucket = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") % 100
    if bucket < _TEST_BUCKETS:
        return "test"
    if bucket < _TEST_BUCKETS + _VALIDATION_BUCKETS:
        return "validation"
    return "train"
