"""MoE routing capture and replay for the trainer's forward (R2 / R3), as a scoped override.

Why an override and not a fork: the model stays transformers' ``GptOssForCausalLM``. Inside ``with
MoeRouting(model, ...)`` each decoder layer's ``mlp`` gets an instance-level ``forward`` that does what
``GptOssMLP.forward`` does — router logits, top-k, softmax over the chosen logits, ``mlp.experts`` — except
that, where replay ids are given, it uses those experts instead of its own top-k. Leaving the block deletes
the instance attribute and the class forward is back.

Replay keeps the router trainable: the combine weights are ``softmax(logits[replayed ids])`` from the
*current* router logits (GPT-OSS's convention: softmax over the selected experts' logits only), so the
policy loss still sends gradients to the router, at the replayed experts. Without replay, the output is
bit-identical to ``GptOssMLP.forward`` (same router call, same scores, same experts call).

Memory: the experts run through ``mlp.experts`` (transformers' ``grouped_mm`` by default, or the per-expert
loop of ``eager``), which computes only the ``T·k`` routed token-expert pairs; ``tests/models/test_routing.py``
asserts that no tensor in the MoE is larger than ``T·k·2I`` in eval and train mode, which an
all-experts-for-all-tokens path (``T·E·2I``) or a per-token weight gather (``batched_mm``: ``T·k·H·2I``)
would violate.

Alignment: replay ids and the recorded routing are ``[B, T, L, k]`` over the batch grid. A model call may
cover only part of that grid (the shared-prefix scoring runs the prefix at batch 1, then the tails), so the
caller names the part with :meth:`MoeRouting.window`; each MoE call checks that its input matches it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP

NOT_ROUTED = -1
"""Marks a token-layer without recorded routing (padding, or a position the engine never ran the MoE on)."""


def routing_dtype(num_experts: int) -> torch.dtype:
    """Smallest signed int dtype holding expert ids and the ``-1`` marker: int8 up to 127 experts, else int16."""
    if num_experts < 1:
        raise ValueError(f"num_experts must be >= 1, got {num_experts}")
    return torch.int8 if num_experts <= 127 else torch.int16


def moe_layers(model: torch.nn.Module) -> list[GptOssMLP]:
    """The ``mlp`` (router + experts) module of every decoder layer of a GPT-OSS causal LM, in order."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None or not all(hasattr(x, "mlp") and hasattr(x.mlp, "router") for x in layers):
        raise TypeError(f"{type(model).__name__} is not a GPT-OSS causal LM (no model.layers[i].mlp.router)")
    return [layer.mlp for layer in layers]


class MoeRouting:
    """Scoped routing override of every MoE layer of ``model`` for one ``[B, T]`` batch.

    ``replay``: ``[B, T, L, k]`` expert ids (any int dtype) to use instead of the router's top-k; a token-layer
    with any id ``< 0`` falls back to the router's own top-k. None: route normally (record only).
    After the forward, :attr:`own` ``[B, T, L, k]`` holds the router's own top-k, :attr:`used` the experts that
    ran, :attr:`logits` ``[B, T, L, E]`` the detached fp32 router logits (for load metrics and the aux loss).
    """

    def __init__(self, model: torch.nn.Module, batch_shape: tuple[int, int], replay: torch.Tensor | None = None):
        self._mlps = moe_layers(model)
        impl = getattr(getattr(model, "config", None), "_experts_implementation", None)
        if impl == "batched_mm":
            raise ValueError(
                "experts_implementation='batched_mm' copies each routed expert's weights per token "
                "(T·k·H·2I floats); score with 'grouped_mm' (the default) or 'eager'"
            )
        first = self._mlps[0].router
        self.num_layers, self.top_k, self.num_experts = len(self._mlps), int(first.top_k), int(first.num_experts)
        b, t = batch_shape
        grid = (b, t, self.num_layers, self.top_k)
        if replay is not None:
            if tuple(replay.shape) != grid:
                raise ValueError(f"replay routing has shape {tuple(replay.shape)}, expected [B, T, L, k] = {grid}")
            if int(replay.max()) >= self.num_experts:
                raise ValueError(f"replay routing names expert {int(replay.max())}; the model has {self.num_experts}")
        on = first.weight.device  # the records live where the router runs (replay ids are moved there once)
        self.replay = None if replay is None else replay.to(on, torch.long)
        self.own = torch.full(grid, NOT_ROUTED, dtype=torch.long, device=on)
        self.used = torch.full(grid, NOT_ROUTED, dtype=torch.long, device=on)
        self.logits = torch.zeros(b, t, self.num_layers, self.num_experts, device=on)
        self._rows, self._cols = slice(0, b), slice(0, t)

    def __enter__(self) -> MoeRouting:
        for i, mlp in enumerate(self._mlps):
            if "forward" in vars(mlp):
                raise RuntimeError("MoeRouting blocks cannot be nested on the same model")
            mlp.forward = _bind(self, i, mlp)  # type: ignore[method-assign]  # instance-level, by design
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for mlp in self._mlps:
            vars(mlp).pop("forward", None)

    @contextmanager
    def window(self, rows: slice, cols: slice) -> Iterator[None]:
        """Model calls inside cover rows ``rows`` and positions ``cols`` of the ``[B, T]`` grid."""
        saved = self._rows, self._cols
        self._rows, self._cols = rows, cols
        try:
            yield
        finally:
            self._rows, self._cols = saved

    def broadcast_rows(self, cols: slice) -> None:
        """Copy row 0's records at positions ``cols`` to every row (after a batch-1 shared-prefix call)."""
        for t in (self.own, self.used, self.logits):
            t[:, cols] = t[0:1, cols]

    def shared_replay_len(self, p: int) -> int:
        """Longest ``n <= p`` such that every row replays the same routing at positions ``< n`` (so a shared
        prefix computed once at batch 1 is exact under replay)."""
        if self.replay is None or p == 0:
            return p
        same = (self.replay[:, :p] == self.replay[:1, :p]).flatten(2).all(-1).all(0)  # [p]
        return int(same.long().cumprod(0).sum())

    def _forward(self, layer: int, mlp: GptOssMLP, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``GptOssMLP.forward`` with replay and recording: ``hidden`` ``[b, t, H]`` → (``[b, t, H]``, scores)."""
        b, t, h = hidden.shape
        rows, cols = self._rows, self._cols
        own_view = self.own[rows, cols, layer]
        if tuple(own_view.shape[:2]) != (b, t):
            raise RuntimeError(f"MoE input [{b}, {t}] does not match the routing window {tuple(own_view.shape[:2])}")
        x = hidden.reshape(-1, h)
        logits, scores, ids = mlp.router(x)  # [N, E], [N, k], [N, k]
        self.own[rows, cols, layer] = ids.detach().view(b, t, -1)
        self.logits[rows, cols, layer] = logits.detach().float().view(b, t, -1)
        if self.replay is not None:
            wanted = self.replay[rows, cols, layer].reshape(-1, self.top_k)
            ids = torch.where((wanted >= 0).all(-1, keepdim=True), wanted, ids)
            # GPT-OSS combine weights, at the replayed experts, from the current (differentiable) logits
            scores = F.softmax(logits.gather(1, ids), dim=1, dtype=logits.dtype)
        self.used[rows, cols, layer] = ids.detach().view(b, t, -1)
        out = mlp.experts(x, ids, scores)
        return out.reshape(b, t, h), scores


def _bind(
    routing: MoeRouting, layer: int, mlp: GptOssMLP
) -> Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    def forward(hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return routing._forward(layer, mlp, hidden_states)

    return forward
