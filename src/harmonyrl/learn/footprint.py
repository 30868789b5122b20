"""The analytic memory model: what an RL run of a gpt-oss model needs on its device, component by component.

:func:`estimate` takes a model geometry (a ``GptOssConfig``: a preset's, a checkpoint's, or the published 20b/120b
in :mod:`harmonyrl.models.synthetic`) and a :class:`Plan` (LoRA or full, dtypes, checkpointing, tokens per
micro-batch, where the reference and the engine live) and returns a :class:`Footprint` in bytes:

* **weights** — every parameter at ``weight_bytes`` (2: bf16, 4: fp32; frozen experts may be MXFP4, 4.25 bits);
  LoRA adapters are counted apart, in fp32.
* **master / grads / optimizer** — for what trains only: an fp32 master copy when the trained weights are kept
  in bf16, fp32 gradients, AdamW's two fp32 moments.
* **activations** — the peak of one micro-batch's forward and backward (below).
* **reference** — a separate reference policy's weights (``copy``), or 0 when it is the same base with the
  adapters disabled (``shared``) or there is no KL term.
* **engine** — the embedded engine's weights (``copy`` at ``engine_bytes``, or ``shared`` with the trainer: then it
  owns only its merged copies ``W + BA`` of the matrices LoRA adapts) and
  its KV cache: ``2 · kv_heads · head_dim`` values per token per layer for ``kv_sequences × kv_length`` tokens,
  sliding-window layers holding only their window of each sequence when ``kv_window`` is on.
* **other models** — what a run holds beside the policy (a distillation teacher, a checkpoint opponent and its
  engine's KV cache); 0 here: :func:`harmonyrl.plan.estimate.other_models` counts them from the run config.

**Activations**, for ``N`` tokens in one micro-batch and an O(T) attention kernel (``harmonyrl_sink_sdpa``,
``harmonyrl_flex_sink``; the eager kernels' ``[B, H, T, T]`` scores are not modelled), in values per token, with
``H`` hidden, ``k`` routed experts, ``I`` the experts' width, ``q = heads · head_dim``, ``V`` the vocabulary
(key/value heads are repeated to ``q``'s width before attention and add nothing of their own; neither does the
number of experts):

* **with activation checkpointing** each layer keeps only its input (``L · H``), and the backward's peak is the
  larger of two phases: the log-probs (:data:`LOGITS_PHASE`: ``4V + 0.9H + 490``: logits, log-softmax, its exp
  for the entropy, the gradient, in fp32, at most ``LOGITS_BUDGET`` logits at once since the trainer scores in
  chunks above it, :mod:`harmonyrl.learn.token_scores`) and one recomputed layer's forward and backward
  (:data:`RECOMPUTED_LAYER`: ``6.8H + 2.3kH + 3q + 9.9kI + 420``);
* **without it** every layer's saved activations stay (:data:`STACKED_LAYER`: ``2.7H + kH + 4.2q + 5.7kI + 5``
  each: a layer in a stack shares its hidden-size tensors with its neighbours), and the log-prob phase comes on
  top.

The coefficients were fitted by least squares to measured peaks (``torch.profiler``'s live CPU tensors above the
update's start, as ``benchmarks/memory.py`` measures) of whole ``Learner.update`` calls: 25 checkpointed LoRA
updates over 16 geometries (H 64–384, I 64–512, k 1–4, q 64–384, V 256–4096, L 2–8, 2k–4k tokens; every one
within ±6 %), 8 without checkpointing (±1 %). ``tests/learn/test_footprint.py`` checks the predicted peak on
geometries that were not among those, within ±15 % (the figures are in docs/gpu.md), and the static parts exactly.
``tests/learn/test_footprint.py`` checks the update's predicted peak against the measured one on scaled
configs with LoRA and checkpointing (within ±15 %, the figures in docs/gpu.md) and the static parts exactly.
Not validated here: bf16 activations (predicted at 2 bytes, to be checked by ``scripts/gpu_check.sh``), the
full fine-tune's gradient peak (gradients are counted whole, an upper bound), and the CUDA experts kernels of
transformers, which may save other intermediates than the CPU path measured here.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, fields
from typing import Literal

from transformers import GptOssConfig

from harmonyrl.errors import CheckpointError
from harmonyrl.learn.token_scores import LOGITS_BUDGET
from harmonyrl.models.real import build_skeleton

RECOMPUTED_LAYER = (6.8, 2.3, 3.0, 9.9, 420.0)
"""Values per token at a checkpointed layer's backward peak: coefficients of (H, kH, q, kI, 1)."""
STACKED_LAYER = (2.7, 1.0, 4.2, 5.7, 5.0)
"""Values per token one layer of a stack saves for its backward without checkpointing: (H, kH, q, kI, 1)."""
LOGITS_PHASE = (4.0, 0.9, 490.0)
"""fp32 values per token in the log-prob phase: coefficients of (V, H, 1); 4 ``[N, V]`` copies."""
MXFP4_BYTES = 4.25 / 8
"""Bytes per MXFP4 value: 4 bits, plus one 8-bit scale per 32 values."""
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
EXPERTS = (".mlp.experts.gate_up_proj", ".mlp.experts.down_proj")
GIB = 2**30


@dataclass(frozen=True)
class Plan:
    """How the run holds the model. Defaults: the GPU plan for gpt-oss-20b (LoRA r=16 on attention, bf16 base,
    checkpointing, 4k tokens a micro-batch, reference shared, engine colocated and shared)."""

    lora_rank: int | None = 16
    """LoRA rank (None: full fine-tuning)."""
    lora_targets: tuple[str, ...] = ATTENTION
    """Adapted modules: attention projections and/or ``experts``."""
    weight_bytes: float = 2.0
    """Bytes per base weight (bf16: 2, fp32: 4)."""
    frozen_experts_mxfp4: bool = False
    """Frozen expert matrices kept as MXFP4 (4.25 bits) instead of ``weight_bytes``."""
    activation_bytes: int = 2
    """Bytes per activation value (bf16 compute: 2, fp32: 4); log-probs are always fp32."""
    checkpointing: bool = True
    tokens: int = 4096
    """Tokens in one micro-batch (rows × sequence length)."""
    reference: Literal["shared", "copy", "none"] = "shared"
    engine: Literal["shared", "copy", "none"] = "shared"
    engine_bytes: float = 2.0
    """Bytes per weight of the engine's copy (``engine='copy'``) and per KV value."""
    kv_sequences: int = 64
    """Sequences the engine's KV cache holds at once (its ``max_batch``)."""
    kv_length: int = 8192
    """Tokens per sequence (its ``max_seq_len``)."""
    kv_window: bool = True
    """Sliding-window layers keep only their window of keys and values."""
    logits_budget: int | None = LOGITS_BUDGET
    """Most logits scored at once (the trainer's chunking, :mod:`harmonyrl.learn.token_scores`); None: the whole
    ``[N, V]`` in one piece, as a plain ``log_softmax(logits.float())`` does (the GPU check's first run did)."""


@dataclass(frozen=True)
class Footprint:
    """Bytes per component on the trainer's device (see the module docstring)."""

    weights: float
    adapters: float
    master: float
    grads: float
    optimizer: float
    activations: float
    reference: float
    engine_weights: float
    kv_cache: float
    other_models: float = 0.0
    """Models held beside the policy, unsharded (see the module docstring)."""

    @property
    def update_peak(self) -> float:
        """What one update allocates above the resting state at most: activations beside the gradients, or
        the gradients beside AdamW's moments (allocated at the first step, after the activations are freed)."""
        return max(self.activations + self.grads, self.grads + self.optimizer)

    @property
    def total(self) -> float:
        resting = self.weights + self.adapters + self.master + self.reference + self.engine_weights + self.kv_cache
        return resting + self.other_models + self.update_peak

    def rows(self) -> list[tuple[str, float]]:
        """``(component, GiB)`` for a table, with the peak total last."""
        return [(f.name, getattr(self, f.name) / GIB) for f in fields(self)] + [("total (peak)", self.total / GIB)]


def per_token(config: GptOssConfig, coefficients: tuple[float, ...]) -> float:
    """A layer's values per token: ``coefficients`` of (H, kH, q, kI, 1) (module docstring)."""
    h, k = config.hidden_size, config.num_experts_per_tok
    terms = (h, k * h, config.num_attention_heads * config.head_dim, k * config.intermediate_size, 1)
    return sum(c * t for c, t in zip(coefficients, terms, strict=True))


def estimate(config: GptOssConfig, plan: Plan = Plan()) -> Footprint:
    """The footprint of an RL run of ``config``'s model held as ``plan`` says."""
    base, experts, adapters, adapted = _parameters(config, plan)
    expert_bytes = MXFP4_BYTES if plan.frozen_experts_mxfp4 and plan.lora_rank is not None else plan.weight_bytes
    weights = (base - experts) * plan.weight_bytes + experts * expert_bytes
    trainable = adapters if plan.lora_rank is not None else base
    master = trainable * 4.0 if plan.lora_rank is None and plan.weight_bytes < 4 else 0.0
    reference = weights if plan.reference == "copy" else 0.0
    # a shared engine owns only its merged copies of the adapted matrices (W + BA), the rest is the trainer's
    owned = {"copy": float(base), "shared": float(adapted), "none": 0.0}[plan.engine]
    engine_weights = owned * plan.engine_bytes
    return Footprint(
        weights=weights,
        adapters=adapters * 4.0,
        master=master,
        grads=trainable * 4.0,
        optimizer=trainable * 8.0,
        activations=activation_peak(config, plan),
        reference=reference,
        engine_weights=engine_weights,
        kv_cache=kv_cache(config, plan) if plan.engine != "none" else 0.0,
    )


def check_fits(config: GptOssConfig, weight_bytes: float, free: int | None, where: str) -> None:
    """A one-line :class:`~harmonyrl.errors.CheckpointError` when ``config``'s weights alone, at ``weight_bytes``
    each, exceed ``free`` bytes (``where``: the checkpoint and the device, for the message). Checked before any
    weight is read: a checkpoint that cannot fit fails in a second, not after minutes of loading."""
    if free is None:
        return
    need = estimate(config, Plan(lora_rank=None, weight_bytes=weight_bytes, reference="none", engine="none")).weights
    if need > free:
        raise CheckpointError(
            f"{where}: its weights need {need / GIB:.1f} GiB at {weight_bytes:g} bytes each, but only "
            f"{free / GIB:.1f} GiB are free there (a smaller model, model.lora with model.precision=bf16, or a larger "
            "device; docs/gpu.md gives the memory a run needs)"
        )


def activation_peak(config: GptOssConfig, plan: Plan) -> float:
    """Bytes alive at the peak of one micro-batch's forward and backward (module docstring)."""
    n, h, layers, act = plan.tokens, config.hidden_size, config.num_hidden_layers, plan.activation_bytes
    per_v, per_h, per_1 = LOGITS_PHASE
    scored = n * config.vocab_size if plan.logits_budget is None else min(n * config.vocab_size, plan.logits_budget)
    logits = per_v * scored * 4 + n * (per_h * h + per_1) * act
    if plan.checkpointing:
        return n * layers * h * act + max(logits, n * per_token(config, RECOMPUTED_LAYER) * act)
    return layers * n * per_token(config, STACKED_LAYER) * act + logits


def kv_cache(config: GptOssConfig, plan: Plan) -> float:
    """The engine's keys and values for ``kv_sequences`` sequences of ``kv_length`` tokens (module docstring)."""
    per_token = 2 * config.num_key_value_heads * config.head_dim * plan.engine_bytes
    types = config.layer_types or ["full_attention"] * config.num_hidden_layers
    window = config.sliding_window or plan.kv_length
    kept = [min(window, plan.kv_length) if t == "sliding_attention" and plan.kv_window else plan.kv_length
            for t in types]  # fmt: skip
    return float(per_token * plan.kv_sequences * sum(kept))


def parameter_count(config: GptOssConfig) -> tuple[int, int]:
    """(every parameter, of which expert matrices) of ``config``'s model, counted on the meta skeleton."""
    base, experts, _, _ = _parameters(config, Plan(lora_rank=None))
    return base, experts


def _parameters(config: GptOssConfig, plan: Plan) -> tuple[int, int, int, int]:
    """(base parameters, of which expert matrices, LoRA adapter parameters, base parameters they adapt), counted on
    the meta skeleton."""
    base = experts = adapters = adapted = 0
    plain = copy.deepcopy(config)  # a config a trainer's model carries may name a kernel only it registered
    plain._attn_implementation = "eager"
    for name, p in build_skeleton(plain).named_parameters():
        base += p.numel()
        if name.endswith(EXPERTS):
            experts += p.numel()
            if plan.lora_rank is not None and "experts" in plan.lora_targets:
                e, fan_in, fan_out = p.shape
                adapters += e * plan.lora_rank * (fan_in + fan_out)
                adapted += p.numel()
        elif plan.lora_rank is not None and name.endswith(".weight") and name.split(".")[-2] in plan.lora_targets:
            fan_out, fan_in = p.shape
            adapters += plan.lora_rank * (fan_in + fan_out)
            adapted += p.numel()
    return base, experts, adapters, adapted
