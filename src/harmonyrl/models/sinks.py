"""How much attention the GPT-OSS sinks take: the measure, and the knob that makes it large.

A sink logit ``s_h`` joins head ``h``'s softmax denominator and carries no value, so a query whose key logits
have log-sum-exp ``lse`` gives the sink the share ``σ(s_h − lse)`` of its attention — and multiplies its output
by ``1 − σ(s_h − lse)``. A kernel that ignores the sink (``harmonyrl_sinkless``) drops exactly that factor, so
how far it is from the true model is governed by this share: near 0 for freshly initialised sinks (``s ≈ 0``
against tens of keys), large in released GPT-OSS checkpoints, where many heads put most of their mass on the
sink. :func:`set_sinks` starts a fresh model in that regime (``model.sink_init``); :func:`sink_mass_by_layer`
measures the share per layer and head on real inputs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from harmonyrl.models.attention import set_kernel

if TYPE_CHECKING:
    from transformers import GptOssForCausalLM


def sink_mass(logits: torch.Tensor, sinks: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
    """Attention probability on the sink per query: ``exp(s_h) / (exp(s_h) + Σ_keep exp(logit))``.

    ``logits`` ``[B, H, T, S]`` scaled key logits; ``sinks`` ``[H]``; ``keep`` boolean ``[B|1, 1|H, T, S]`` (None:
    every key visible). Returns ``[B, H, T]``; a query that sees no key gives its whole mass (1) to the sink.
    """
    if keep is not None:
        logits = logits.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(logits.double(), dim=-1)  # -inf where no key is visible: σ(+inf) = 1
    return torch.sigmoid(sinks.double().view(1, -1, 1) - lse).to(logits.dtype)


def mass_from_weights(weights: torch.Tensor) -> torch.Tensor:
    """Sink share per query from transformers' eager attention weights ``[B, H, T, S]`` (the sink column is dropped
    there, so the rows sum to ``1 − sink share``): ``[B, H, T]``."""
    return 1.0 - weights.double().sum(dim=-1)


def mean_over_queries(mass: torch.Tensor, query_mask: torch.Tensor) -> torch.Tensor:
    """``[B, H, T]`` per-query sink share → ``[H]`` mean over the real queries (``query_mask`` ``[B, T]``)."""
    m = query_mask.bool()[:, None, :].expand_as(mass)
    return (mass * m).sum(dim=(0, 2)) / m.sum(dim=(0, 2)).clamp(min=1)


def set_sinks(model: GptOssForCausalLM, value: float) -> None:
    """Set every attention sink logit of ``model`` to ``value`` (in place)."""
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.fill_(value)


@torch.no_grad()
def sink_mass_by_layer(model: GptOssForCausalLM, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean sink share per layer and head ``[L, H]`` over the real tokens of ``input_ids`` ``[B, T]``.

    Runs one forward with transformers' eager kernel (the only one that returns attention weights), then restores
    the model's kernel; sliding-window layers are measured with their window, as they run."""
    kernel = model.config._attn_implementation
    was_training = model.training
    set_kernel(model, "eager")
    try:
        model.eval()
        out = model(input_ids=input_ids, attention_mask=attention_mask, output_attentions=True)
    finally:
        set_kernel(model, kernel)
        model.train(was_training)
    return torch.stack([mean_over_queries(mass_from_weights(w), attention_mask) for w in out.attentions]).float()
