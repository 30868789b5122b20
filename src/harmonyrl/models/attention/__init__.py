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

One module per kernel: :mod:`.eager` (``harmonyrl_eager`` and the chunked twins), :mod:`.fused` (the fused
sink kernel and its sink-less twin), :mod:`.flex` (the CUDA kernel); :mod:`.masks` reads transformers' masks
for all of them. This module is the registry: which kernels exist, which may train where, and switching a model's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from transformers import AttentionInterface, AttentionMaskInterface
from transformers.masking_utils import eager_mask

from harmonyrl.models.attention.eager import chunked_eager, thread_invariant_eager, torch_softmax
from harmonyrl.models.attention.flex import FLEX_KERNEL, flex_block_mask, flex_kernel, flex_sink, merge_sink
from harmonyrl.models.attention.fused import sdpa_kernel, sink_sdpa
from harmonyrl.models.attention.masks import boolean_mask
from harmonyrl.models.thread_invariant import softmax_last_dim

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = [
    "CHUNKED_EAGER",
    "CUDA_TRAINING_ONLY",
    "FLEX_KERNEL",
    "KERNELS",
    "THREAD_INVARIANT_KERNELS",
    "KernelName",
    "chunk_eager_queries",
    "flex_block_mask",
    "flex_sink",
    "kernel_of",
    "merge_sink",
    "register_kernels",
    "set_kernel",
    "sink_sdpa",
]

KernelName = Literal["eager", "harmonyrl_eager", "harmonyrl_sink_sdpa", "harmonyrl_sinkless", "harmonyrl_flex_sink"]
KERNELS: tuple[KernelName, ...] = (
    "eager",
    "harmonyrl_eager",
    "harmonyrl_sink_sdpa",
    "harmonyrl_sinkless",
    "harmonyrl_flex_sink",
)
THREAD_INVARIANT_KERNELS: frozenset[str] = frozenset({"harmonyrl_eager", "harmonyrl_sink_sdpa", "harmonyrl_sinkless"})
"""Kernels whose training gradients are the same bits with any number of threads (``tests/test_thread_invariance.py``
checks every kernel); transformers' ``eager`` is not (torch's CPU softmax backward)."""
CHUNKED_EAGER: dict[str, str] = {
    "eager": "harmonyrl_eager_chunked",
    "harmonyrl_eager": "harmonyrl_eager_thread_chunked",
}
"""Each eager kernel's query-chunked twin (same rows, bounded temporaries); see the module docstring."""

CUDA_TRAINING_ONLY: frozenset[str] = frozenset({FLEX_KERNEL})
"""Kernels with no backward on the CPU (torch refuses flex attention's there): the run config refuses them for a
CPU trainer (``harmonyrl.config.model.CUDA_ONLY_ATTENTION`` names the same set without importing transformers)."""


def register_kernels() -> None:
    """Make the kernels selectable as ``config._attn_implementation`` (idempotent). Masks are HF's boolean
    sdpa masks (sliding window included)."""
    for name, with_sink in (("harmonyrl_sink_sdpa", True), ("harmonyrl_sinkless", False)):
        AttentionInterface.register(name, sdpa_kernel(with_sink))
        AttentionMaskInterface.register(name, boolean_mask)
    AttentionInterface.register(FLEX_KERNEL, flex_kernel)
    AttentionMaskInterface.register(FLEX_KERNEL, flex_block_mask)
    AttentionInterface.register("harmonyrl_eager", thread_invariant_eager)
    AttentionMaskInterface.register("harmonyrl_eager", eager_mask)  # the additive mask transformers' eager takes
    for eager, softmax in (("eager", torch_softmax), ("harmonyrl_eager", softmax_last_dim)):
        AttentionInterface.register(CHUNKED_EAGER[eager], chunked_eager(softmax))
        # boolean (a quarter of eager's float mask) or none at all for a causal layer: the chunks build their part
        AttentionMaskInterface.register(CHUNKED_EAGER[eager], boolean_mask)


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
