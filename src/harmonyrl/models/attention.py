"""Attention kernels for GPT-OSS layers, selectable per side (trainer, engine) by config.

GPT-OSS attention has a learned *sink* logit per query head that joins the softmax denominator and then
carries no value, so a head can attend to "nothing". transformers runs it only through its eager kernel on
CPU (sdpa is refused, flex attention refuses sinks). Kernels here, registered with transformers'
``AttentionInterface`` so ``GptOssForCausalLM`` calls them in training exactly like its own:

* ``eager`` — transformers' reference (materialises the ``[B, H, T, S + 1]`` logits).
* ``harmonyrl_sink_sdpa`` — exact and fused: one ``scaled_dot_product_attention`` call on an augmented head
  dimension. Each query gets one extra coordinate ``sink_h / scale``; real keys get 0 there; one extra key
  is ``e_{D+1}`` with a zero value. Its logit is then exactly ``sink_h`` and it adds ``exp(sink_h)`` to the
  denominator while contributing nothing to the output — the sink, with gradients for q, k, v *and* the sink
  logits flowing through the fused kernel's own backward. Grouped KV heads stay grouped (``enable_gqa``);
  the per-head sink lives on the query side, so heads sharing a KV head keep their own sinks.
* ``harmonyrl_sinkless`` — the same fused path *without* the sink: deliberately wrong, to reproduce the
  sampler/trainer mismatch of the public GPT-OSS retrospective in experiments.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.masking_utils import sdpa_mask

KernelName = Literal["eager", "harmonyrl_sink_sdpa", "harmonyrl_sinkless"]
KERNELS: tuple[KernelName, ...] = ("eager", "harmonyrl_sink_sdpa", "harmonyrl_sinkless")


def _keep_mask(attention_mask: torch.Tensor | None, s: int) -> torch.Tensor | None:
    """HF's mask as boolean "may attend" ``[B|1, 1, T, S]`` (it may arrive additive or boolean)."""
    if attention_mask is None:
        return None
    mask = attention_mask[..., :s]
    return mask if mask.dtype == torch.bool else mask == 0


def sink_sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    sinks: torch.Tensor | None,
    keep: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    """Fused GPT-OSS attention. ``query`` ``[B, H, T, D]``; ``key``/``value`` ``[B, KVH, S, D]``; ``sinks`` ``[H]``
    (None: no sink); ``keep`` boolean ``[B|1, 1, T, S]`` (None: attend everywhere). Returns ``[B, H, T, D]``."""
    b, h, t, d = query.shape
    kvh, s = key.shape[1], key.shape[2]
    if sinks is None:
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=keep, scale=scale, enable_gqa=h != kvh)
        return out
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


def _hf_kernel(with_sink: bool) -> Any:
    def attention(
        module: torch.nn.Module,
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
        if keep is None and t > 1:  # no mask given: causal, queries aligned to the last keys
            keep = torch.ones(t, s, dtype=torch.bool, device=query.device).tril(diagonal=s - t)[None, None]
        sinks = module.sinks if with_sink else None
        out = sink_sdpa(query, key, value, sinks, keep, scaling)
        return out.transpose(1, 2).contiguous(), None

    return attention


def _explicit_sdpa_mask(*args: Any, **kwargs: Any) -> torch.Tensor | None:
    """HF's boolean sdpa mask, never skipped: HF drops a purely causal mask so that SDPA can use
    ``is_causal``, but our augmented sink key is not causal, so the kernel needs the mask written out."""
    kwargs["allow_is_causal_skip"] = False
    return sdpa_mask(*args, **kwargs)


def register_kernels() -> None:
    """Make the kernels selectable as ``config._attn_implementation`` (idempotent). Masks are HF's boolean
    sdpa masks (sliding window included), always materialised."""
    for name, with_sink in (("harmonyrl_sink_sdpa", True), ("harmonyrl_sinkless", False)):
        AttentionInterface.register(name, _hf_kernel(with_sink))
        AttentionMaskInterface.register(name, _explicit_sdpa_mask)


def set_kernel(model: torch.nn.Module, kernel: KernelName) -> None:
    """Switch a loaded GPT-OSS model's attention kernel in place (training and scoring passes)."""
    if kernel not in KERNELS:
        raise ValueError(f"unknown attention kernel {kernel!r}; choose from {', '.join(KERNELS)}")
    register_kernels()
    model.config._attn_implementation = kernel
    for module in model.modules():
        cfg = getattr(module, "config", None)
        if cfg is not None and hasattr(cfg, "_attn_implementation"):
            cfg._attn_implementation = kernel
