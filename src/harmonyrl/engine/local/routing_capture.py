"""Routing capture for the embedded engine: which experts each position ran through, per MoE layer.

How: every layer's ``mlp.router`` (the HF module that :func:`~harmonyrl.engine.local.moe.routed_moe` calls in
prefill and decode) gets an instance-level ``forward`` that calls the class's and keeps the top-k ids of each call
(the engine's modules are its own, built by :mod:`.weights`, even when their tensors are the trainer's: nothing
else sees the wrapper). Not a
``register_forward_hook``: a hooked module takes ``nn.Module``'s slow call path (measured at 32 rows: router
call 21 → 29 µs with a hook, 22 µs with this wrapper). After each
:class:`~harmonyrl.engine.local.forward.LeanForward` call the engine hands the ids here with the call's layout, and
they are written into a per-slot buffer ``[slots, max_seq_len, L, k]`` (int8 for ≤ 127 experts), the routing
twin of the KV cache. A finished request reads its slot's rows ``0 .. len(prompt) + n - 2`` (every position
the engine fed). No host sync and one small scatter per decode step, so the overhead is small
(``benchmarks/routing.py``: ~2 % of the engine's busy time).

Layouts (see ``LeanForward``): prefill runs layers ``0..L-2`` on all ``[n, T]`` padded positions (only the
real ones are kept) and the last layer only at each row's last prompt token; :meth:`LeanForward.prefix` runs
layers ``0..L-2`` on the prefix; decode runs every layer on one token per row. A cached prefix carries its
routing, copied into the slot with its keys and values. Positions a layer never ran stay ``-1``: their MoE
output never reached a sampled token's logits, so the trainer may route them itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssTopKRouter

from harmonyrl.models.moe_routing import NOT_ROUTED, moe_layers, routing_dtype


class EngineRouting:
    """Per-slot routing buffer of a :class:`~harmonyrl.engine.local.engine.LocalEngine`, filled by router hooks."""

    def __init__(self, model: torch.nn.Module, slots: int, max_seq_len: int) -> None:
        mlps = moe_layers(model)
        router = mlps[0].router
        self.num_layers, self.top_k = len(mlps), int(router.top_k)
        self.dtype = routing_dtype(int(router.num_experts))
        self.device = router.weight.device
        shape = (slots, max_seq_len, self.num_layers, self.top_k)
        self.buffer = torch.full(shape, NOT_ROUTED, dtype=self.dtype, device=self.device)
        self._calls: list[list[torch.Tensor]] = [[] for _ in mlps]
        self._routers = [m.router for m in mlps]
        for i, router in enumerate(self._routers):
            router.forward = self._recording(i, router)  # type: ignore[method-assign]  # instance-level, by design

    def _recording(self, layer: int, router: GptOssTopKRouter) -> Callable[[torch.Tensor], tuple[torch.Tensor, ...]]:
        forward: Callable[[GptOssTopKRouter, torch.Tensor], tuple[torch.Tensor, ...]] = type(router).forward

        def record(hidden: torch.Tensor) -> tuple[torch.Tensor, ...]:
            out = forward(router, hidden)  # (logits, scores, ids): ids [N, k]
            self._calls[layer].append(out[2])
            return out

        return record

    def _take(self) -> list[torch.Tensor | None]:
        """The ids of each layer's latest router call since the last take (None: layer not run). Earlier calls
        can only be leftovers of a forward that raised (its step failed its requests), so they are dropped."""
        out: list[torch.Tensor | None] = []
        for calls in self._calls:
            out.append(calls[-1] if calls else None)
            calls.clear()
        return out

    def clear(self, slots: torch.Tensor) -> None:
        """Forget old routing of newly admitted ``slots`` ``[n]``."""
        self.buffer[slots] = NOT_ROUTED

    def after_prefix(self, length: int) -> torch.Tensor:
        """The routing ``[P, L, k]`` of a just-computed ``length``-token shared prefix, for :meth:`load_prefix`."""
        ids = torch.full((length, self.num_layers, self.top_k), NOT_ROUTED, dtype=self.dtype, device=self.device)
        for layer, got in enumerate(self._take()):
            if got is not None:
                ids[:, layer] = got.view(length, self.top_k)
        return ids

    def load_prefix(self, ids: torch.Tensor, slots: torch.Tensor) -> None:
        """Copy a cached prefix's routing ``[P, L, k]`` into positions ``0 .. P-1`` of ``slots`` ``[n]``."""
        self.buffer[slots, : ids.shape[0]] = ids

    def after_prefill(self, slots: torch.Tensor, starts: torch.Tensor, width: int, lengths: torch.Tensor) -> None:
        """Record a prefill of right-padded tails ``[n, width]``, row ``r``'s at positions ``starts[r] ..``."""
        n = slots.shape[0]
        real_r, real_t = (torch.arange(width, device=self.device) < lengths[:, None]).nonzero(as_tuple=True)
        last = starts + lengths - 1
        for layer, got in enumerate(self._take()):
            if got is None:
                continue
            if got.shape[0] == n * width:
                ids = got.view(n, width, self.top_k)[real_r, real_t]
                self.buffer[slots[real_r], starts[real_r] + real_t, layer] = ids.to(self.dtype)
            elif got.shape[0] == n:  # the last layer runs only at each row's last prompt token
                self.buffer[slots, last, layer] = got.to(self.dtype)
            else:
                raise RuntimeError(f"prefill router call of {got.shape[0]} rows fits neither [n, T] nor [n]")

    def after_decode(self, slots: torch.Tensor, positions: torch.Tensor) -> None:
        """Record a decode step: one token per row at ``positions`` ``[B]`` of ``slots`` ``[B]``."""
        taken = self._take()
        ran = [got for got in taken if got is not None]
        if len(ran) == len(taken):  # the usual case: every layer ran, one scatter for all of them
            self.buffer[slots, positions] = torch.stack(ran, dim=1).to(self.dtype)
            return
        for layer, got in enumerate(taken):
            if got is not None:
                self.buffer[slots, positions, layer] = got.to(self.dtype)

    def write_decode(self, slots: torch.Tensor, positions: torch.Tensor, ids: torch.Tensor) -> None:
        """Record a decode step whose routing came back directly (the compiled step): ids ``[B, L, k]``."""
        self.buffer[slots, positions] = ids.to(self.dtype)

    def move(self, src: int, dst: int, positions: int) -> None:
        """Copy slot ``src``'s routing at positions ``0 .. positions-1`` into slot ``dst`` (with its cache)."""
        self.buffer[dst, :positions] = self.buffer[src, :positions]

    def read(self, slot: int, positions: int) -> torch.Tensor:
        """A copy of slot ``slot``'s routing at positions ``0 .. positions - 1``: ``[positions, L, k]``."""
        return self.buffer[slot, :positions].to("cpu", copy=True)  # kept with the episode, on the host

    def close(self) -> None:
        """Give the routers their class ``forward`` back (recording stops)."""
        for router in self._routers:
            vars(router).pop("forward", None)
