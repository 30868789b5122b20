"""``harmonyrl_eager`` and the eager kernels' query-chunked twins.

The two eager kernels have query-chunked twins (:data:`~harmonyrl.models.attention.CHUNKED_EAGER`, not user-facing
names): the same operations on :data:`EAGER_CHUNK_ELEMENTS`-sized blocks of query rows, so a ``[B, H, T, S + 1]``
score tensor and its softmax copies never exist whole. Activation checkpointing switches to them
(:func:`~harmonyrl.models.attention.chunk_eager_queries`): with every layer's activations recomputed, the peak of an
update is the recomputed layer's attention temporaries (measured, docs/memory.md). Each row's softmax sees the row's
whole key range and the same additive mask values as eager (``0`` / the dtype's minimum), so the rows come out as
eager's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from transformers.models.gpt_oss.modeling_gpt_oss import repeat_kv

from harmonyrl.models.attention.masks import keep_mask
from harmonyrl.models.thread_invariant import softmax_last_dim

if TYPE_CHECKING:
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssAttention

EAGER_CHUNK_ELEMENTS = 1 << 21
"""Most score elements (``B · H · rows · (S + 1)``, 8 MiB in fp32) a chunked eager kernel forms at once."""


def thread_invariant_eager(
    module: GptOssAttention,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' eager GPT-OSS attention, operation for operation, but for the softmax's backward."""
    if dropout and module.training:
        raise ValueError("harmonyrl attention kernels do not implement attention dropout")
    key_states = repeat_kv(key, module.num_key_value_groups)
    value_states = repeat_kv(value, module.num_key_value_groups)
    weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    if attention_mask is not None:
        weights = weights + attention_mask
    sinks = module.sinks.reshape(1, -1, 1, 1).expand(query.shape[0], -1, query.shape[-2], -1)
    combined = torch.cat([weights, sinks], dim=-1)
    combined = combined - combined.max(dim=-1, keepdim=True).values
    scores = softmax_last_dim(combined)[..., :-1]  # the sink takes its share, then is dropped
    out = torch.matmul(scores.to(value_states.dtype), value_states)
    return out.transpose(1, 2).contiguous(), scores


def _eager_rows(
    module: GptOssAttention,
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    keep: torch.Tensor,
    scaling: float,
    softmax: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """transformers' eager GPT-OSS attention for some query rows: ``query`` ``[B, H, c, D]``, ``keys``/``values``
    ``[B, H, S, D]`` (KV heads repeated), ``keep`` boolean ``[B|1, 1, c, S]`` → ``[B, H, c, D]``."""
    zero = torch.zeros((), dtype=module.sinks.dtype, device=keep.device)
    bias = torch.where(keep, zero, torch.finfo(module.sinks.dtype).min)
    weights = torch.matmul(query, keys.transpose(2, 3)) * scaling + bias  # eager_mask's 0 / min, added as eager does
    sinks = module.sinks.reshape(1, -1, 1, 1).expand(query.shape[0], -1, query.shape[-2], -1)
    combined = torch.cat([weights, sinks], dim=-1)
    combined = combined - combined.max(dim=-1, keepdim=True).values
    scores = softmax(combined)[..., :-1]  # the sink takes its share, then is dropped
    return torch.matmul(scores.to(values.dtype), values)


def torch_softmax(x: torch.Tensor) -> torch.Tensor:
    return F.softmax(x, dim=-1, dtype=x.dtype)  # what transformers' eager kernel calls


def chunked_eager(softmax: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    def attention(
        module: GptOssAttention,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        scaling: float,
        dropout: float = 0.0,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        if dropout and module.training:
            raise ValueError("harmonyrl attention kernels do not implement attention dropout")
        b, h, t, _ = query.shape
        s = key.shape[2]
        keep = keep_mask(attention_mask, s)
        keys, values = repeat_kv(key, module.num_key_value_groups), repeat_kv(value, module.num_key_value_groups)
        rows = max(1, EAGER_CHUNK_ELEMENTS // (b * h * (s + 1)))
        parts = []
        for q0 in range(0, t, rows):
            q1 = min(q0 + rows, t)
            if keep is None:  # HF skipped a causal mask: queries aligned to the last keys
                chunk = torch.ones(q1 - q0, s, dtype=torch.bool, device=query.device).tril(q0 + s - t)[None, None]
            else:
                chunk = keep[..., q0:q1, :]
            parts.append(_eager_rows(module, query[:, :, q0:q1], keys, values, chunk, scaling, softmax))
        out = parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)
        return out.transpose(1, 2).contiguous(), None

    return attention
