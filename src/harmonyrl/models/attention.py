"""Attention kernels for GPT-OSS layers, selectable per side (trainer, engine) by config.

GPT-OSS attention has a learned *sink* logit per query head that joins the softmax denominator and then
carries no value, so a head can attend to "nothing". transformers runs it only through its eager kernel on
CPU (sdpa is refused, flex attention refuses sinks). Kernels here, registered with transformers'
``AttentionInterface`` so ``GptOssForCausalLM`` calls them in training exactly like its own:

* ``eager`` — transformers' reference (materialises the ``[B, H, T, S + 1]`` logits).
* ``harmonyrl_eager`` — the same operations, bit for bit in the forward pass, with a softmax whose backward
  (:mod:`harmonyrl.models.thread_invariant`) does not depend on the OpenMP thread count. torch's fused CPU softmax
  backward does, so with ``eager`` a step's gradients change with the number of threads (docs/contention.md).
  (MKL's matrix products for a few rows do too, so this alone does not make a run independent of the team.)
* ``harmonyrl_sink_sdpa`` — exact and fused: one ``scaled_dot_product_attention`` call on an augmented head
  dimension. Each query gets one extra coordinate ``sink_h / scale``; real keys get 0 there; one extra key
  is ``e_{D+1}`` with a zero value. Its logit is then exactly ``sink_h`` and it adds ``exp(sink_h)`` to the
  denominator while contributing nothing to the output — the sink, with gradients for q, k, v *and* the sink
  logits flowing through the fused kernel's own backward. Grouped KV heads stay grouped (``enable_gqa``);
  the per-head sink lives on the query side, so heads sharing a KV head keep their own sinks.
* ``harmonyrl_sinkless`` — the same fused path *without* the sink: deliberately wrong, to reproduce the
  sampler/trainer mismatch of the public GPT-OSS retrospective in experiments.
* ``harmonyrl_flex_sink`` — the CUDA kernel: exact, O(T) memory in forward and backward, sliding windows skipped
  block by block (torch's flex attention, the sink merged through the log-sum-exp; see the end of this docstring).
  Trains on CUDA only; its forward also runs on the CPU, where it is tested.

The two eager kernels have query-chunked twins (:data:`CHUNKED_EAGER`, not user-facing names): the same
operations on :data:`EAGER_CHUNK_ELEMENTS`-sized blocks of query rows, so a ``[B, H, T, S + 1]`` score tensor and
its softmax copies never exist whole. Activation checkpointing switches to them (:func:`chunk_eager_queries`):
with every layer's activations recomputed, the peak of an update is the recomputed layer's attention
temporaries (measured, docs/memory.md). Each row's softmax sees the row's whole key range and the same additive
mask values as eager (``0`` / the dtype's minimum), so the rows come out as eager's.

On CPU the sink kernel takes a faster route (:class:`_FlashSink`, measured by ``benchmarks/attention.py``). The
augmented key above forces an explicit mask, and a masked SDPA call visits every query/key block: causal
block skipping is lost and a 128-token sliding window costs as much as full attention. Instead the sink is
applied through the log-sum-exp that torch's CPU flash kernel already returns: with ``o`` the sink-less output
and ``lse`` its log-normaliser, the sink output is exactly ``o · sigmoid(lse − sink)``. The backward reuses the
flash backward: feeding it ``grad · σ`` together with the *sink* output makes its internal row term
``Σ grad·σ · out`` equal the sink softmax's, so dq, dk and dv are exact, and the sink gradient is
``−Σ (1 − σ) · (grad · out)``. Plain causal layers (HF skips their mask, see :func:`_sdpa_mask`) run as one
``is_causal`` call; masked layers run in query chunks that each see only the key columns their mask
reaches, so a sliding-window layer costs O(T · (chunk + window)) instead of O(T²).

On CUDA, ``harmonyrl_flex_sink`` (:func:`flex_sink`) is the O(T) kernel: torch's flex attention runs the sink-less
softmax over a :class:`~torch.nn.attention.flex_attention.BlockMask` (causal, sliding window, padding and cache
offsets, built by :func:`_flex_block_mask` from the same mask function transformers hands every kernel) and
returns its log-normaliser, and the sink is merged exactly as above, ``o · σ(lse − sink)``, with plain
differentiable ops in fp32. The backward is flex's own (which takes the gradient of ``lse`` too) plus autograd
of that merge: no ``[B, H, T, S]`` tensor in either direction, and blocks outside the window are skipped. Why not
transformers' own ``flex_attention`` kernel, which renormalises by the sink the same way: it rounds ``lse`` to the
activation dtype first (in bf16 an ``lse`` of 10 is off by up to 0.03, the output by up to 3 %), and it refuses to
run on the CPU, where this one's forward is tested against eager.

Fused only when compiled: on CUDA flex runs through one ``torch.compile(flex_attention)`` per process
(:func:`_compiled_flex`; automatic dynamic shapes, so a new sequence length costs one more compile, then the
shape is symbolic) and the block mask is built compiled too; uncompiled, flex materialises the scores. On the
CPU flex runs uncompiled (compiling costs ~15 s per shape there and buys nothing for a test), forward only:
torch refuses flex's backward on the CPU, so the config refuses this kernel for CPU training
(``harmonyrl.config.run``) and :func:`flex_sink` names the problem if it is reached anyway.
:func:`check_flex_sink` compares forward and every gradient with eager on a given device (the GPU check).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable
from torch.nn.attention import flex_attention as flex
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.masking_utils import (
    add_offsets_to_mask_function,
    and_masks,
    eager_mask,
    padding_mask_function,
    prepare_padding_mask,
    sdpa_mask,
)
from transformers.models.gpt_oss.modeling_gpt_oss import repeat_kv

from harmonyrl.models.thread_invariant import softmax_last_dim

if TYPE_CHECKING:
    from transformers import PreTrainedModel
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssAttention

KernelName = Literal["eager", "harmonyrl_eager", "harmonyrl_sink_sdpa", "harmonyrl_sinkless", "harmonyrl_flex_sink"]
KERNELS: tuple[KernelName, ...] = (
    "eager",
    "harmonyrl_eager",
    "harmonyrl_sink_sdpa",
    "harmonyrl_sinkless",
    "harmonyrl_flex_sink",
)
FLEX_KERNEL: KernelName = "harmonyrl_flex_sink"
THREAD_INVARIANT_KERNELS: frozenset[str] = frozenset({"harmonyrl_eager", "harmonyrl_sink_sdpa", "harmonyrl_sinkless"})
"""Kernels whose training gradients are the same bits with any number of threads (``tests/test_thread_invariance.py``
checks every kernel); transformers' ``eager`` is not (torch's CPU softmax backward)."""
CHUNKED_EAGER: dict[str, str] = {
    "eager": "harmonyrl_eager_chunked",
    "harmonyrl_eager": "harmonyrl_eager_thread_chunked",
}
"""Each eager kernel's query-chunked twin (same rows, bounded temporaries); see the module docstring."""
EAGER_CHUNK_ELEMENTS = 1 << 21
"""Most score elements (``B · H · rows · (S + 1)``, 8 MiB in fp32) a chunked eager kernel forms at once."""


def _keep_mask(attention_mask: torch.Tensor | None, s: int) -> torch.Tensor | None:
    """HF's mask as boolean "may attend" ``[B|1, 1, T, S]`` (it may arrive additive or boolean)."""
    if attention_mask is None:
        return None
    mask = attention_mask[..., :s]
    return mask if mask.dtype == torch.bool else mask == 0


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


def _hf_kernel(with_sink: bool) -> Any:
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
        keep = _keep_mask(attention_mask, s)
        causal = keep is None and t > 1 and t == s  # HF skipped a purely causal mask (see _sdpa_mask)
        if keep is None and 1 < t != s:  # no mask given: causal, queries aligned to the last keys
            keep = torch.ones(t, s, dtype=torch.bool, device=query.device).tril(diagonal=s - t)[None, None]
        sinks = module.sinks if with_sink else None
        out = sink_sdpa(query, key, value, sinks, keep, scaling, causal=causal)
        return out.transpose(1, 2).contiguous(), None

    return attention


CUDA_TRAINING_ONLY: frozenset[str] = frozenset({FLEX_KERNEL})
"""Kernels with no backward on the CPU (torch refuses flex attention's there): the run config refuses them for a
CPU trainer (``harmonyrl.config.model.CUDA_ONLY_ATTENTION`` names the same set without importing transformers)."""

_AUX_REQUEST: Any = getattr(flex, "AuxRequest", None)
"""``AuxRequest`` (torch ≥ 2.9: ``return_aux=AuxRequest(lse=True)``); None on older torch, which takes the
deprecated ``return_lse=True`` instead. torch 2.11 and 2.13 have both; ``return_lse`` warns there."""

FLEX_DYNAMIC: bool | None = None
"""``dynamic`` of the one ``torch.compile(flex_attention)``: None is torch's automatic dynamic shapes (the first
shape compiles static, the first different one recompiles with symbolic lengths, later lengths reuse it), as
transformers compiles its own flex kernel."""


@functools.cache
def _compiled_flex() -> Callable[..., Any]:
    """flex attention compiled once per process (fused Triton kernels on CUDA; the uncompiled call materialises
    the ``[B, H, T, S]`` scores)."""
    return torch.compile(flex.flex_attention, dynamic=FLEX_DYNAMIC)


def _flex_call(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    block_mask: flex.BlockMask,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sink-less attention output ``[B, H, T, D]`` (query dtype) and its natural-log normaliser ``[B, H, T]`` (fp32;
    ``-inf`` for a row that sees no key, whose output is 0), both differentiable on CUDA."""
    h, kvh = query.shape[1], key.shape[1]
    gqa = h != kvh
    if gqa and h & (h - 1):  # flex's GQA path wants a power-of-two head count (as transformers' flex kernel does)
        key, value = key.repeat_interleave(h // kvh, dim=1), value.repeat_interleave(h // kvh, dim=1)
        gqa = False
    on_cpu = query.device.type == "cpu"
    fn: Any = flex.flex_attention if on_cpu or torch.compiler.is_compiling() else _compiled_flex()
    lse_kwargs = {"return_aux": _AUX_REQUEST(lse=True)} if _AUX_REQUEST is not None else {"return_lse": True}
    with warnings.catch_warnings():
        if on_cpu:  # uncompiled on purpose there (module docstring); torch warns about it once per process
            warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        out, aux = fn(query, key, value, block_mask=block_mask, scale=scale, enable_gqa=gqa, **lse_kwargs)
    lse = aux if isinstance(aux, torch.Tensor) else aux.lse
    return out, lse


def merge_sink(out: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """Sink attention from sink-less attention: ``out`` ``[B, H, T, D]`` and its log-normaliser ``lse`` ``[B, H, T]``
    (natural log, ``-inf`` where a row sees nothing), ``sinks`` ``[H]`` → ``out · σ(lse − sink)`` in ``out``'s
    dtype. The gate is computed in fp32 or wider (``lse`` is never rounded to bf16); plain ops, so autograd carries
    the gradient to ``out``, ``lse`` and the sinks."""
    wide = torch.promote_types(out.dtype, torch.float32)
    gate = torch.sigmoid(lse.to(wide) - sinks.to(wide).view(1, -1, 1))
    return (out.to(wide) * gate.unsqueeze(-1)).to(out.dtype)


def flex_sink(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    sinks: torch.Tensor,
    block_mask: flex.BlockMask,
    scale: float,
) -> torch.Tensor:
    """GPT-OSS sink attention on flex attention: ``query`` ``[B, H, T, D]``, ``key``/``value`` ``[B, KVH, S, D]``,
    ``sinks`` ``[H]``, ``block_mask`` over ``[B|1, 1, T, S]`` → ``[B, H, T, D]`` (module docstring)."""
    grad = torch.is_grad_enabled() and any(x.requires_grad for x in (query, key, value, sinks))
    if query.device.type == "cpu" and grad:
        raise ValueError(
            f"attention kernel {FLEX_KERNEL} has no backward on the CPU (torch's flex attention refuses it); "
            "train with device=cuda, or choose harmonyrl_sink_sdpa / harmonyrl_eager"
        )
    if query.device.type == "cpu":  # no graph is built (grad mode is off), but flex refuses leaves that want one
        query, key, value = query.detach(), key.detach(), value.detach()
    if key.dtype != query.dtype or value.dtype != query.dtype:  # flex wants one dtype (autocast may leave fp32 k/v)
        key, value = key.to(query.dtype), value.to(query.dtype)
    out, lse = _flex_call(query, key, value, block_mask, scale)
    return merge_sink(out, lse, sinks)


def _flex_block_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int = 0,
    kv_offset: int = 0,
    mask_function: Callable[..., Any] | None = None,
    attention_mask: torch.Tensor | None = None,
    device: torch.device | str = "cpu",
    **kwargs: Any,
) -> flex.BlockMask:
    """transformers' ``flex_attention_mask`` (the same mask function with padding and offsets, so causal, sliding
    window, padding and a cache's offsets all come from transformers), except that the block mask is built
    compiled only on CUDA: on the CPU compiling costs ~15 s per shape, uncompiled it forms one ``[B, 1, T, S]``
    boolean mask, which the CPU (forward-only) path can afford."""
    mask_mod = mask_function or (lambda b, h, q, kv: kv <= q)
    if attention_mask is not None and not bool(attention_mask.all()):
        padding = prepare_padding_mask(attention_mask, kv_length, kv_offset)
        assert padding is not None  # it is None only without an attention_mask
        mask_mod = and_masks(mask_mod, padding_mask_function(padding))
    mask_mod = add_offsets_to_mask_function(mask_mod, q_offset, kv_offset)
    on_cuda = torch.device(device).type == "cuda"
    return flex.create_block_mask(mask_mod, batch_size, None, q_length, kv_length, device=device, _compile=on_cuda)


def _dense_block_mask(keep: torch.Tensor | None, b: int, t: int, s: int, device: torch.device) -> flex.BlockMask:
    """A block mask for a kernel call that did not get one from :func:`_flex_block_mask`: a boolean / additive
    ``[B|1, 1, T, S]`` mask (a caller's own 4D mask), or none at all: causal, queries aligned to the last keys."""
    if keep is None:
        offset = s - t

        def causal(bi: torch.Tensor, hi: torch.Tensor, qi: torch.Tensor, ki: torch.Tensor) -> torch.Tensor:
            return ki <= qi + offset

        return flex.create_block_mask(causal, None, None, t, s, device=device)
    rows = keep.expand(b, 1, t, s)

    def dense(bi: torch.Tensor, hi: torch.Tensor, qi: torch.Tensor, ki: torch.Tensor) -> torch.Tensor:
        return rows[bi, 0, qi, ki]

    return flex.create_block_mask(dense, b, None, t, s, device=device)


def _flex_kernel(
    module: GptOssAttention,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: flex.BlockMask | torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    if dropout and module.training:
        raise ValueError("harmonyrl attention kernels do not implement attention dropout")
    b, t, s = query.shape[0], query.shape[2], key.shape[2]
    if isinstance(attention_mask, flex.BlockMask):
        block_mask = attention_mask
    else:
        keep = _keep_mask(attention_mask, s)
        block_mask = _dense_block_mask(keep, b, t, s, query.device)
    out = flex_sink(query, key, value, module.sinks, block_mask, scaling)
    return out.transpose(1, 2).contiguous(), None


def _thread_invariant_eager(
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


def _torch_softmax(x: torch.Tensor) -> torch.Tensor:
    return F.softmax(x, dim=-1, dtype=x.dtype)  # what transformers' eager kernel calls


def _chunked_eager(softmax: Callable[[torch.Tensor], torch.Tensor]) -> Any:
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
        keep = _keep_mask(attention_mask, s)
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


def _sdpa_mask(*args: Any, **kwargs: Any) -> torch.Tensor | None:
    """HF's boolean sdpa mask. HF returns None for a purely causal mask with ``T == S`` (or a single query, which
    sees every key) so that the kernel can skip the masked blocks; sliding-window layers whose window binds
    and padded batches always get the mask written out."""
    return sdpa_mask(*args, **kwargs)


def register_kernels() -> None:
    """Make the kernels selectable as ``config._attn_implementation`` (idempotent). Masks are HF's boolean
    sdpa masks (sliding window included)."""
    for name, with_sink in (("harmonyrl_sink_sdpa", True), ("harmonyrl_sinkless", False)):
        AttentionInterface.register(name, _hf_kernel(with_sink))
        AttentionMaskInterface.register(name, _sdpa_mask)
    AttentionInterface.register(FLEX_KERNEL, _flex_kernel)
    AttentionMaskInterface.register(FLEX_KERNEL, _flex_block_mask)
    AttentionInterface.register("harmonyrl_eager", _thread_invariant_eager)
    AttentionMaskInterface.register("harmonyrl_eager", eager_mask)  # the additive mask transformers' eager takes
    for eager, softmax in (("eager", _torch_softmax), ("harmonyrl_eager", softmax_last_dim)):
        AttentionInterface.register(CHUNKED_EAGER[eager], _chunked_eager(softmax))
        # boolean (a quarter of eager's float mask) or none at all for a causal layer: the chunks build their part
        AttentionMaskInterface.register(CHUNKED_EAGER[eager], _sdpa_mask)


def set_kernel(model: PreTrainedModel, kernel: str) -> None:
    """Switch a loaded GPT-OSS model's attention kernel in place (training and scoring passes): one of
    :data:`KERNELS` or their chunked twins (:data:`CHUNKED_EAGER`)."""
    if kernel not in KERNELS and kernel not in CHUNKED_EAGER.values():
        raise ValueError(f"unknown attention kernel {kernel!r}; choose from {', '.join(KERNELS)}")
    register_kernels()
    model.config._attn_implementation = kernel
    for module in model.modules():
        cfg = getattr(module, "config", None)
        if cfg is not None and hasattr(cfg, "_attn_implementation"):
            cfg._attn_implementation = kernel


def kernel_of(model: PreTrainedModel) -> str:
    """The attention kernel ``model`` runs (``config._attn_implementation``)."""
    return str(model.config._attn_implementation)


def chunk_eager_queries(model: PreTrainedModel) -> None:
    """If ``model`` runs an eager kernel, switch it to that kernel's query-chunked twin (same rows, no
    ``[B, H, T, S + 1]`` tensor); other kernels never form one and are left as they are."""
    kernel = kernel_of(model)
    if kernel in CHUNKED_EAGER:
        set_kernel(model, CHUNKED_EAGER[kernel])
