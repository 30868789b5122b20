"""``harmonyrl_sink_sdpa`` and ``harmonyrl_sinkless``: GPT-OSS sink attention as fused scaled-dot-product
attention (the augmented form is described in :mod:`harmonyrl.models.attention`).

On CPU the sink kernel takes a faster route (:class:`_FlashSink`, measured by ``benchmarks/attention.py``). The
augmented key above forces an explicit mask, and a masked SDPA call visits every query/key block: causal
block skipping is lost and a 128-token sliding window costs as much as full attention. Instead the sink is
applied through the log-sum-exp that torch's CPU flash kernel already returns: with ``o`` the sink-less output
and ``lse`` its log-normaliser, the sink output is exactly ``o · sigmoid(lse − sink)``. The backward reuses the
flash backward: feeding it ``grad · σ`` together with the *sink* output makes its internal row term
``Σ grad·σ · out`` equal the sink softmax's, so dq, dk and dv are exact, and the sink gradient is
``−Σ (1 − σ) · (grad · out)``. Plain causal layers (HF skips their mask, see :func:`boolean_mask`) run as one
``is_causal`` call; masked layers run in query chunks that each see only the key columns their mask
reaches, so a sliding-window layer costs O(T · (chunk + window)) instead of O(T²).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from harmonyrl.models.attention.masks import keep_mask

if TYPE_CHECKING:
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssAttention

QUERY_CHUNK = 128
"""Queries per flash call on masked layers: small enough that a sliding-window chunk reads few keys beyond the
window, large enough that per-call overhead stays small (tuned with ``benchmarks/attention.py``)."""

_FLASH_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def sink_sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    sinks: torch.Tensor | None,
    keep: torch.Tensor | None,
    scale: float,
    causal: bool = False,
) -> torch.Tensor:
    """Fused GPT-OSS attention. ``query`` ``[B, H, T, D]``; ``key``/``value`` ``[B, KVH, S, D]``; ``sinks`` ``[H]``
    (None: no sink); ``keep`` boolean ``[B|1, 1, T, S]`` (None: attend everywhere, or causally if ``causal``,
    which needs ``T == S``). Returns ``[B, H, T, D]``."""
    h, kvh = query.shape[1], key.shape[1]
    if keep is not None and causal:
        raise ValueError("pass either a mask or causal=True, not both")
    if sinks is None:
        return F.scaled_dot_product_attention(
            query, key, value, attn_mask=keep, is_causal=causal, scale=scale, enable_gqa=h != kvh
        )
    if query.device.type == "cpu" and query.dtype in _FLASH_DTYPES and not torch.jit.is_scripting():
        if h != kvh:  # the CPU flash op has no GQA; autograd sums the repeated heads' gradients back
            key, value = key.repeat_interleave(h // kvh, dim=1), value.repeat_interleave(h // kvh, dim=1)
        spans = _plan(keep, query.shape[2], key.shape[2])
        # torch leaves Function.apply unannotated (it forwards to forward(), whose type is ours)
        out: torch.Tensor = _FlashSink.apply(  # type: ignore[no-untyped-call]
            query, key, value, sinks, keep, spans, scale, causal
        )
        return out
    if causal:
        t, s = query.shape[2], key.shape[2]
        keep = torch.ones(t, s, dtype=torch.bool, device=query.device).tril()[None, None]
    return _augmented_sdpa(query, key, value, sinks, keep, scale)


def _augmented_sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    sinks: torch.Tensor,
    keep: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    """The portable sink kernel (any device): the sink as an extra key on an extra head dimension."""
    b, h, t, d = query.shape
    kvh, s = key.shape[1], key.shape[2]
    sink_q = (sinks.to(query.dtype) / scale).view(1, h, 1, 1).expand(b, h, t, 1)
    q = torch.cat([query, sink_q], dim=-1)
    k = torch.cat([key, key.new_zeros(b, kvh, s, 1)], dim=-1)
    sink_key = key.new_zeros(b, kvh, 1, d + 1)
    sink_key[..., d] = 1.0
    k = torch.cat([k, sink_key], dim=2)  # [B, KVH, S + 1, D + 1]
    v = torch.cat([value, value.new_zeros(b, kvh, s, 1)], dim=-1)
    v = torch.cat([v, value.new_zeros(b, kvh, 1, d + 1)], dim=2)
    if keep is not None:
        keep = torch.cat([keep, keep.new_ones(*keep.shape[:-1], 1)], dim=-1)  # the sink is always visible
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, scale=scale, enable_gqa=h != kvh)
    return out[..., :d]


Span = tuple[int, int, int, int]


def _plan(keep: torch.Tensor | None, t: int, s: int) -> tuple[Span, ...]:
    """Query chunks ``(q0, q1, k0, k1)``: each chunk reads only the key columns ``k0:k1`` its mask rows reach.
    A chunk that sees no key at all is left out: its output is 0, exactly as in eager, where the sink then takes
    all the probability."""
    if keep is None:
        return ((0, t, 0, s),)
    reach = keep.expand(-1, -1, t, s).any(dim=1).any(dim=0)  # [T, S]
    spans = []
    for q0 in range(0, t, QUERY_CHUNK):
        q1 = min(q0 + QUERY_CHUNK, t)
        cols = reach[q0:q1].any(dim=0).nonzero()
        if len(cols):
            spans.append((q0, q1, int(cols[0]), int(cols[-1]) + 1))
    return tuple(spans)


def _bias(keep: torch.Tensor | None, span: Span, dtype: torch.dtype) -> torch.Tensor | None:
    """One chunk's additive mask (flash wants it in the query dtype), built on demand: a full ``[B, 1, T, S]``
    float mask would cost 4× HF's boolean one."""
    if keep is None:
        return None
    q0, q1, k0, k1 = span
    chunk = keep[..., q0:q1, k0:k1]
    return torch.zeros(chunk.shape, dtype=dtype, device=chunk.device).masked_fill_(~chunk, float("-inf"))


_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


class _FlashSink(torch.autograd.Function):
    """Sink attention on torch's CPU flash kernel; the sink enters through the log-sum-exp (module docstring).
    ``q``, ``k``, ``v`` ``[B, H, T|S, D]`` (KV heads already repeated); ``keep`` boolean ``[B|1, 1, T, S]``."""

    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        sinks: torch.Tensor,
        keep: torch.Tensor | None,
        spans: tuple[Span, ...],
        scale: float,
        causal: bool,
    ) -> torch.Tensor:
        b, h, t, d = q.shape
        out = q.new_zeros(b, t, h, d).transpose(1, 2)  # flash's own layout: the caller transposes it back for free
        lse = q.new_zeros(b, h, t, dtype=torch.float32)
        gate = q.new_zeros(b, h, t, dtype=torch.float32)  # σ(lse − sink); stays 0 in chunks that see no key
        for q0, q1, k0, k1 in spans:
            mask = _bias(keep, (q0, q1, k0, k1), q.dtype)
            o, chunk_lse = _flash(
                q[:, :, q0:q1], k[:, :, k0:k1], v[:, :, k0:k1], 0.0, causal, attn_mask=mask, scale=scale
            )
            lse[:, :, q0:q1] = chunk_lse
            gate[:, :, q0:q1] = torch.sigmoid(chunk_lse - sinks.float().view(1, h, 1))
            out[:, :, q0:q1] = o * gate[:, :, q0:q1, None].to(o.dtype)
        ctx.save_for_backward(q, k, v, sinks, keep, out, lse, gate)
        ctx.spans, ctx.scale, ctx.causal = spans, scale, causal
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, sinks, keep, out, lse, gate = ctx.saved_tensors
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        scaled = grad * gate[..., None].to(grad.dtype)
        for q0, q1, k0, k1 in ctx.spans:
            mask = _bias(keep, (q0, q1, k0, k1), q.dtype)
            gq, gk, gv = _flash_backward(
                scaled[:, :, q0:q1],
                q[:, :, q0:q1],
                k[:, :, k0:k1],
                v[:, :, k0:k1],
                out[:, :, q0:q1],
                lse[:, :, q0:q1],
                0.0,
                ctx.causal,
                attn_mask=mask,
                scale=ctx.scale,
            )
            dq[:, :, q0:q1] = gq
            dk[:, :, k0:k1] += gk
            dv[:, :, k0:k1] += gv
        row = (grad.float() * out.float()).sum(-1)  # [B, H, T]
        dsinks = -((1.0 - gate) * row).sum(dim=(0, 2)) if ctx.needs_input_grad[3] else None
        gsinks = None if dsinks is None else dsinks.to(sinks.dtype)
        return dq, dk, dv, gsinks, None, None, None, None


def sdpa_kernel(with_sink: bool) -> Any:
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
        t, s = query.shape[2], key.shape[2]
        keep = keep_mask(attention_mask, s)
        causal = keep is None and t > 1 and t == s  # HF skipped a purely causal mask (see boolean_mask)
        if keep is None and 1 < t != s:  # no mask given: causal, queries aligned to the last keys
            keep = torch.ones(t, s, dtype=torch.bool, device=query.device).tril(diagonal=s - t)[None, None]
        sinks = module.sinks if with_sink else None
        out = sink_sdpa(query, key, value, sinks, keep, scaling, causal=causal)
        return out.transpose(1, 2).contiguous(), None

    return attention
