"""Keys and values of token prefixes the engine has already computed, so a prompt that extends one is prefilled
from where it ends.

Two kinds of entries share one least-recently-used store with a byte budget:

* an environment's shared head (system + developer messages), computed once by ``LeanForward.prefix`` when
  several new prompts start with it;
* a finished generation's whole conversation (prompt + sampled tokens but the last, which was never fed):
  an agent's next turn re-sends exactly those ids followed by the tool result (token in, token out), so
  only the last sampled token and the tool result are prefilled instead of the whole conversation.

An entry's keys/values are those the engine computed, prefill or decode path alike; both agree with the
trainer's forward to fp32 rounding (tested), and the entry carries the routing that produced them, so routing
replay stays consistent with the cache. Sliding-window layers keep only the last ``W`` positions of an entry
(:class:`~harmonyrl.engine.local.kv_cache.KVSnapshot`): a continuation cannot read further back.

Also here: which head new prompts share (:func:`common_prefix`) and how rows whose tails start at different
positions are grouped into prefill calls (:func:`prefill_groups`).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from harmonyrl.engine.local.kv_cache import KVSnapshot


@dataclass(frozen=True)
class CachedPrefix:
    """Keys and values of a ``P``-token prefix (:class:`KVSnapshot`); ``routing`` ``[P, layers, k]`` expert ids
    (None when the engine does not record routing)."""

    kv: KVSnapshot
    routing: torch.Tensor | None

    @property
    def nbytes(self) -> int:
        extra = self.routing.nbytes if self.routing is not None else 0
        return self.kv.nbytes + extra


class PrefixCache:
    """Token prefix → :class:`CachedPrefix`, least recently used evicted first once over ``budget_bytes``."""

    def __init__(self, budget_bytes: int) -> None:
        if budget_bytes < 0:
            raise ValueError(f"prefix cache budget must be >= 0 bytes, got {budget_bytes}")
        self.budget_bytes = budget_bytes
        self.nbytes = 0
        self._entries: OrderedDict[tuple[int, ...], CachedPrefix] = OrderedDict()
        self._lengths: Counter[int] = Counter()  # stored key lengths, for the longest-match lookup

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def keys(self) -> list[tuple[int, ...]]:
        """Stored prefixes, least recently used first."""
        return list(self._entries)

    def put(self, key: tuple[int, ...], entry: CachedPrefix) -> None:
        """Store (or refresh) ``key``; an entry larger than the whole budget is not stored."""
        self._drop(key)
        if entry.nbytes > self.budget_bytes:
            return
        self._entries[key] = entry
        self._lengths[len(key)] += 1
        self.nbytes += entry.nbytes
        while self.nbytes > self.budget_bytes:
            self._drop(next(iter(self._entries)))

    def longest(self, prompt: Sequence[int]) -> tuple[tuple[int, ...], CachedPrefix] | None:
        """The longest stored prefix that ``prompt`` starts with and extends by at least one token (marked as
        just used), or None. Costs one slice-and-hash per distinct stored length shorter than the prompt."""
        ids = tuple(prompt)
        for length in sorted(self._lengths, reverse=True):
            if length < len(ids) and (entry := self._entries.get(ids[:length])) is not None:
                self._entries.move_to_end(ids[:length])
                return ids[:length], entry
        return None

    def clear(self) -> None:
        self._entries.clear()
        self._lengths.clear()
        self.nbytes = 0

    def _drop(self, key: tuple[int, ...]) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.nbytes -= entry.nbytes
            self._lengths[len(key)] -= 1
            if not self._lengths[len(key)]:
                del self._lengths[len(key)]


def prefill_groups(lengths: Sequence[int]) -> list[list[int]]:
    """Split rows with tail ``lengths`` into prefill calls (row indices, ascending) so that padding stays at most
    half of each call's tokens: one call is cheapest (each costs a full pass of per-op overhead) unless one long
    tail would pad many short ones, as when a new episode's prompt joins continuing turns."""
    groups: list[list[int]] = []
    current: list[int] = []
    real = 0
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if current and (len(current) + 1) * lengths[current[0]] > 2 * (real + lengths[i]):
            groups.append(sorted(current))
            current, real = [], 0
        current.append(i)
        real += lengths[i]
    return [*groups, sorted(current)] if current else groups


def common_prefix(prompts: Sequence[list[int]]) -> tuple[int, ...]:
    """Longest common prefix of ``prompts``, leaving every prompt at least one token to prefill."""
    limit = min(len(p) for p in prompts) - 1
    n = 0
    while n < limit and all(p[n] == prompts[0][n] for p in prompts):
        n += 1
    return tuple(prompts[0][:n])
