"""Prefill of newly admitted prompts: each after the longest cached prefix it starts with (a shared head, or its
own previous turn), then its tail fed into its KV-cache slot; returns the logits of each prompt's last token.

Two ways to feed the tails, chosen with the decode step:

* **compiled** (``kernel`` native, the CPU default): every tail token is a row of the C step (``NativeDecode.
  prefill``), a prompt's rows one after another in one thread. Each row runs exactly the arithmetic it would
  alone, so a prompt's keys, values and logits do not depend on which other prompts are prefilled beside it, on
  how it splits between a cached prefix and the call, or on the thread count: the engine's log-probs are
  **batch-invariant**. That matters because batch composition is timing: with a slow tool, or in async mode,
  which prompts arrive together differs between two runs of the same seed, and with a shape-dependent prefill
  the recorded behaviour log-probs (and so the update) differed in their last bits (~5e-7). A shared head is
  fed into the first prompt's slot and copied from there.
* **eager torch** (``kernel`` torch, any device): right-padded batches (:func:`.prefix_cache.prefill_groups`)
  through ``LeanForward.prefill``; a shared head through ``LeanForward.prefix``. Its GEMMs' rounding depends on
  the batch shape, so its log-probs are reproducible only when the batches are (fast, in-process tools).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from harmonyrl.engine.local.forward import LeanForward
from harmonyrl.engine.local.native import NativeDecode
from harmonyrl.engine.local.prefix_cache import CachedPrefix, PrefixCache, common_prefix, prefill_groups
from harmonyrl.engine.local.routing_capture import EngineRouting
from harmonyrl.engine.local.stats import EngineStats

MIN_PREFIX = 16
"""Shortest prompt prefix worth caching: shorter ones cost more in bookkeeping than they save."""

Hit = tuple[tuple[int, ...], CachedPrefix] | None


@dataclass
class Prefill:
    """The engine's prefill over its forward, compiled step (None: eager torch), prefix cache and routing record."""

    fwd: LeanForward
    native: NativeDecode | None
    prefixes: PrefixCache
    routing: EngineRouting | None
    stats: EngineStats

    def __call__(self, prompts: Sequence[list[int]], slot_list: Sequence[int]) -> torch.Tensor:
        """Logits ``[n, V]`` of each prompt's last token, in ``prompts`` order; ``slot_list``: each prompt's slot."""
        slots = torch.tensor(list(slot_list), device=self.fwd.device)
        if self.routing is not None:
            self.routing.clear(slots)
        found = self._shared_head(prompts, slot_list, [self.prefixes.longest(p) for p in prompts])
        by_prefix: dict[tuple[int, ...], tuple[CachedPrefix, list[int]]] = {}
        for i, hit in enumerate(found):
            if hit is not None:
                by_prefix.setdefault(hit[0], (hit[1], []))[1].append(i)
        for prefix, (entry, idx) in by_prefix.items():
            self.fwd.load_prefix(entry.kv, slots[idx])
            if self.routing is not None and entry.routing is not None:
                self.routing.load_prefix(entry.routing, slots[idx])
            self.stats.prefix_tokens_reused += len(prefix) * len(idx)
        self.stats.prompt_tokens += sum(len(p) for p in prompts)
        starts = [0 if hit is None else len(hit[0]) for hit in found]
        if self.native is not None:
            return self._feed_native(self.native, prompts, slot_list, starts)
        return self._feed_torch(prompts, slots, starts)

    def _shared_head(self, prompts: Sequence[list[int]], slot_list: Sequence[int], found: list[Hit]) -> list[Hit]:
        """Prompts no cached prefix covers share their common head when there are two or more: cache it once."""
        fresh = [i for i, hit in enumerate(found) if hit is None]
        if len(fresh) < 2 or not self.prefixes.budget_bytes:
            return found
        common = common_prefix([prompts[i] for i in fresh])
        if len(common) < MIN_PREFIX:
            return found
        if self.native is not None:  # fed into the first such prompt's slot, then copied from there
            slot = slot_list[fresh[0]]
            self._feed_native(self.native, [list(common)], [slot], [0], logits=False)  # keys and values only
            routing = self.routing.read(slot, len(common)) if self.routing is not None else None
            entry = CachedPrefix(self.fwd.cache.snapshot(slot, len(common)), routing)
        else:
            kv = self.fwd.prefix(torch.tensor(common, device=self.fwd.device))
            entry = CachedPrefix(kv, self.routing.after_prefix(len(common)) if self.routing else None)
        self.prefixes.put(common, entry)
        return [(common, entry) if i in fresh else hit for i, hit in enumerate(found)]

    def _feed_native(
        self,
        native: NativeDecode,
        prompts: Sequence[list[int]],
        slot_list: Sequence[int],
        starts: Sequence[int],
        logits: bool = True,
    ) -> torch.Tensor:
        """Every prompt's tail (positions ``starts[i]`` on) through the compiled step, one row per token; the
        logits of each prompt's last token (``logits`` False: none, only the keys and values are written)."""
        tokens: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        last: list[int] = []
        for prompt, slot, start in zip(prompts, slot_list, starts, strict=True):
            assert start < len(prompt), "a cached prefix leaves at least one token to prefill"
            tokens += prompt[start:]
            positions += range(start, len(prompt))
            slots += [slot] * (len(prompt) - start)
            last += [len(tokens) - 1] if logits else []
        pos_t, slot_t, last_t = torch.tensor(positions), torch.tensor(slots), torch.tensor(last, dtype=torch.int64)
        out, ids = native.prefill(torch.tensor(tokens), pos_t, slot_t, last_t, self.routing is not None)
        if self.routing is not None and ids is not None:
            self.routing.write_decode(slot_t, pos_t, ids)
        return out

    def _feed_torch(self, prompts: Sequence[list[int]], slots: torch.Tensor, starts: Sequence[int]) -> torch.Tensor:
        """Every prompt's tail through eager torch, in right-padded groups."""
        device = self.fwd.device
        out = torch.empty(len(prompts), self.fwd.model.config.vocab_size, device=device)
        for idx in prefill_groups([len(p) - s for p, s in zip(prompts, starts, strict=True)]):
            tails = [prompts[i][starts[i] :] for i in idx]
            width = max(len(t) for t in tails)
            padded = torch.tensor([t + [0] * (width - len(t)) for t in tails], dtype=torch.long, device=device)
            lengths = torch.tensor([len(t) for t in tails], device=device)
            group_starts = torch.tensor([starts[i] for i in idx], device=device)
            out[torch.tensor(idx, device=device)] = self.fwd.prefill(padded, lengths, slots[idx], group_starts)
            if self.routing is not None:
                self.routing.after_prefill(slots[idx], group_starts, padded.shape[1], lengths)
        return out
