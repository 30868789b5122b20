"""``harmonyrl_flex_sink``: the CUDA sink kernel, O(T) memory in forward and backward.

On CUDA, ``harmonyrl_flex_sink`` (:func:`flex_sink`) is the O(T) kernel: torch's flex attention runs the sink-less
softmax over a :class:`~torch.nn.attention.flex_attention.BlockMask` (causal, sliding window, padding and cache
offsets, built by :func:`flex_block_mask` from the same mask function transformers hands every kernel) and returns
its log-normaliser, and the sink is merged exactly as the CPU route does (:mod:`.fused`), ``o · σ(lse − sink)``,
with plain differentiable ops in fp32. The backward is flex's own (which takes the gradient of ``lse`` too) plus
autograd of that merge: no ``[B, H, T, S]`` tensor in either direction, and blocks outside the window are skipped.
Why not transformers' own ``flex_attention`` kernel, which renormalises by the sink the same way: it rounds ``lse``
to the activation dtype first (in bf16 an ``lse`` of 10 is off by up to 0.03, the output by up to 3 %), and it
refuses to run on the CPU, where this one's forward is tested against eager.

Fused only when compiled: on CUDA flex runs through one ``torch.compile(flex_attention)`` per process
(:func:`_compiled_flex`; automatic dynamic shapes, so a new sequence length costs one more compile, then the shape
is symbolic) and the block mask is built compiled too; uncompiled, flex materialises the scores. On the CPU flex
runs uncompiled (compiling costs ~15 s per shape there and buys nothing for a test), forward only: torch refuses
flex's backward on the CPU, so the config refuses this kernel for CPU training (``harmonyrl.config.run``) and
:func:`flex_sink` names the problem if it is reached anyway. :func:`check_flex_sink` compares forward and every
gradient with eager on a given device (the GPU check).


"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch.nn.attention import flex_attention as flex
from transformers.masking_utils import (
    add_offsets_to_mask_function,
    and_masks,
    padding_mask_function,
    prepare_padding_mask,
)

from harmonyrl.models.attention.masks import keep_mask

if TYPE_CHECKING:
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssAttention

FLEX_KERNEL = "harmonyrl_flex_sink"

_AUX_REQUEST: Any = getattr(flex, "AuxRequest", None)
"""``AuxRequest`` (torch ≥ 2.9: ``return_aux=AuxRequest(lse=True)``); None on older torch, which takes the
deprecated ``return_lse=True`` instead. torch 2.11 and 2.13 have both; ``return_lse`` warns there."""

FLEX_DYNAMIC: bool | None = None
"""``dynamic`` of the one ``torch.compile(flex_attention)``: None is torch's automatic dynamic shapes (the first
shape compiles static, the first different one recompiles with symbolic lengths, later lengths reuse it), as
transformers compiles its own flex kernel."""

FLEX_RECOMPILE_LIMIT = 64
"""Compiled variants of flex (and of the block-mask builder) one process may hold. Each distinct mask function,
dtype, grad mode and static-then-dynamic shape is one; torch's default limit is 8, and past it dynamo runs the call
*uncompiled* (a log warning only), which materialises the ``[B, H, T, S]`` scores: the exactness check's 12 variants
alone reached it, so the benchmark that followed would have timed, and a long run would have trained on, the slow
quadratic path (seen with dynamo's eager backend on the CPU, 2026-11-29: ``tests/models/test_flex_recompiles.py``)."""


FLEX_KERNEL_OPTIONS = {"FORCE_USE_FLEX_ATTENTION": True}
"""Always flex's main (training) kernel. Compiled, inductor picks its decoding kernel for queries shorter than 128
tokens, which found no valid configuration for the exactness check's 100-query cached-prefix case on the H200
(``NoValidChoicesError``, torch 2.11, 2026-11-29) and would do the same to a short training sequence; decoding is
not this kernel's job (the engine decodes with its own)."""


def raise_recompile_limit() -> None:
    """Let dynamo keep :data:`FLEX_RECOMPILE_LIMIT` variants per function (never lowers a larger setting)."""
    config = torch._dynamo.config
    config.recompile_limit = max(int(config.recompile_limit), FLEX_RECOMPILE_LIMIT)


@functools.cache
def _compiled_flex() -> Callable[..., Any]:
    """flex attention compiled once per process (fused Triton kernels on CUDA; the uncompiled call materialises
    the ``[B, H, T, S]`` scores)."""
    raise_recompile_limit()
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
        out, aux = fn(query, key, value, block_mask=block_mask, scale=scale, enable_gqa=gqa,
                      kernel_options=FLEX_KERNEL_OPTIONS, **lse_kwargs)  # fmt: skip
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


def flex_block_mask(
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
    if on_cuda:
        raise_recompile_limit()
    return flex.create_block_mask(mask_mod, batch_size, None, q_length, kv_length, device=device, _compile=on_cuda)


def _dense_block_mask(keep: torch.Tensor | None, b: int, t: int, s: int, device: torch.device) -> flex.BlockMask:
    """A block mask for a kernel call that did not get one from :func:`flex_block_mask`: a boolean / additive
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


def flex_kernel(
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
        keep = keep_mask(attention_mask, s)
        block_mask = _dense_block_mask(keep, b, t, s, query.device)
    out = flex_sink(query, key, value, module.sinks, block_mask, scaling)
    return out.transpose(1, 2).contiguous(), None
