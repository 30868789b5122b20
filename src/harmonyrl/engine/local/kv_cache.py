"""The embedded engine's KV cache: every slot's keys and values, per layer, sized by what the layer can attend to.

A full-attention layer keeps every position, ``[slots, kv_heads, max_seq_len, head_dim]``. A sliding-window layer
(``sliding_attention``, window ``W`` < ``max_seq_len``) keeps only its window: a ring ``[slots, kv_heads, W,
head_dim]`` where position ``p`` lives at ``p % W``. A query at ``q`` reads keys ``q - W + 1 .. q`` (HF's
``sliding_window_overlay``), which are exactly the ring's ``W`` entries once ``q >= W - 1``, so nothing a query can
see is ever overwritten before it is read, and no position beyond the window is kept. For gpt-oss-20b (24 layers,
half of them sliding with ``W = 128``) that halves the KV cache at long contexts: the sliding layers cost
``W`` positions per slot whatever the length.

Why per-layer tensors and not one ``[layers, ...]`` block: the two kinds have different lengths. The compiled step
(``csrc/kernels.h``) gets one pointer and one capacity per layer and reads a ring in position order, so its sums,
and so its logits, are the same bits as with a full-length cache.

A finished conversation or a shared prompt head is kept as a :class:`KVSnapshot`: full layers' keys of every
position, sliding layers' of the last ``W`` only (all a continuation can read).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class KVSnapshot:
    """Keys and values of a ``length``-token prefix, one ``[kv_heads, n_i, head_dim]`` tensor per layer: ``n_i =
    length`` on a full layer, ``min(length, W)`` on a ring layer (its last positions, in position order)."""

    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]
    length: int

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in (*self.keys, *self.values))


class KVCache:
    """Keys/values of every slot, per layer: full length, or a ring of the window on sliding layers (zeros at
    first, never NaN, so masked stale entries contribute exactly 0 to attention)."""

    def __init__(
        self,
        sliding: Sequence[bool],
        slots: int,
        kv_heads: int,
        max_seq_len: int,
        head_dim: int,
        window: int,
        dtype: torch.dtype,
        device: torch.device | None = None,
    ) -> None:
        self.max_seq_len = max_seq_len
        self.caps = [window if s and window < max_seq_len else max_seq_len for s in sliding]
        """Positions each layer keeps per slot: ``W`` on a ring layer, ``max_seq_len`` elsewhere."""
        self.k = [torch.zeros(slots, kv_heads, cap, head_dim, dtype=dtype, device=device) for cap in self.caps]
        self.v = [torch.zeros(slots, kv_heads, cap, head_dim, dtype=dtype, device=device) for cap in self.caps]

    def ring(self, layer: int) -> bool:
        """Whether ``layer`` keeps only its window (position ``p`` at ``p % W``)."""
        return self.caps[layer] < self.max_seq_len

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in (*self.k, *self.v))

    def write(self, layer: int, slots: torch.Tensor, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Keys and values ``[N, kv_heads, head_dim]`` of (slot, position) pairs ``[N]`` into ``layer``. On a ring,
        no two pairs of one slot may be ``W`` or more positions apart (the later would overwrite the earlier)."""
        at = positions % self.caps[layer] if self.ring(layer) else positions
        self.k[layer][slots, :, at] = k
        self.v[layer][slots, :, at] = v

    def write_span(self, layer: int, slots: torch.Tensor, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Keys and values ``[n, kv_heads, T, head_dim]`` of positions ``start .. start + T - 1`` of every slot in
        ``slots`` ``[n]``; a ring keeps the last ``W`` of them."""
        t, cap = k.shape[2], self.caps[layer]
        if not self.ring(layer):
            self.k[layer][slots, :, start : start + t] = k
            self.v[layer][slots, :, start : start + t] = v
            return
        keep = min(t, cap)
        at = torch.arange(start + t - keep, start + t, device=k.device) % cap
        self.k[layer][slots[:, None], :, at[None]] = k[:, :, t - keep :].transpose(1, 2)
        self.v[layer][slots[:, None], :, at[None]] = v[:, :, t - keep :].transpose(1, 2)

    def history(self, layer: int, slots: torch.Tensor, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A ring layer's keys and values ``[n, kv_heads, W - 1, head_dim]`` of positions ``starts[r] - W + 1 ..
        starts[r] - 1`` of each slot (what queries from ``starts[r]`` on may read of the past; entries at negative
        positions are stale and must be masked), read before a prefill's writes can overwrite them."""
        cap = self.caps[layer]
        at = (starts[:, None] - cap + 1 + torch.arange(cap - 1, device=starts.device)) % cap
        rows = slots[:, None]
        return self.k[layer][rows, :, at].transpose(1, 2), self.v[layer][rows, :, at].transpose(1, 2)

    def load(self, snap: KVSnapshot, slots: torch.Tensor) -> None:
        """Copy a snapshot into positions ``0 .. length - 1`` of every slot in ``slots`` ``[n]``."""
        for i, (k, v) in enumerate(zip(snap.keys, snap.values, strict=True)):
            self.write_span(i, slots, snap.length - k.shape[1], k[None], v[None])

    def snapshot(self, slot: int, length: int) -> KVSnapshot:
        """A copy of slot ``slot``'s positions ``0 .. length - 1`` (ring layers: the last ``W``)."""
        keys, values = [], []
        for i, cap in enumerate(self.caps):
            if self.ring(i):
                at = torch.arange(max(0, length - cap), length, device=self.k[i].device) % cap
                keys.append(self.k[i][slot][:, at])
                values.append(self.v[i][slot][:, at])
            else:
                keys.append(self.k[i][slot, :, :length].clone())
                values.append(self.v[i][slot, :, :length].clone())
        return KVSnapshot(tuple(keys), tuple(values), length)

    def move(self, src: int, dst: int, positions: int) -> None:
        """Copy slot ``src``'s positions ``0 .. positions - 1`` into slot ``dst`` (a ring: all of it)."""
        for i in range(len(self.caps)):
            span = slice(None) if self.ring(i) else slice(0, positions)
            self.k[i][dst, :, span] = self.k[i][src, :, span]
            self.v[i][dst, :, span] = self.v[i][src, :, span]

    def state(self) -> list[torch.Tensor]:
        """Copies of every tensor (tests: run two paths from the same cache)."""
        return [t.clone() for t in (*self.k, *self.v)]

    def restore(self, saved: Sequence[torch.Tensor]) -> None:
        """Put a :meth:`state` back."""
        for t, s in zip((*self.k, *self.v), saved, strict=True):
            t.copy_(s)
