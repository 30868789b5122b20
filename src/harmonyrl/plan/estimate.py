"""A run config on given hardware: memory per device, the smallest layout that fits, throughput, time and cost.

Memory is the trainer's memory model (:mod:`harmonyrl.learn.footprint`) for the plan the config implies; FSDP
over ``f`` devices divides weights, adapters, master weights, gradients, optimizer state and a separate reference
by ``f`` (activations are per device). A colocated engine is possible on one device only (it shares the trainer's
weights); with more, rollouts go to a separate engine whose devices hold bf16 weights and the KV cache split over
``t``-way tensor parallelism.

Throughput bounds, per device, with stated utilisations (:data:`TRAIN_MFU`, :data:`PREFILL_MFU`,
:data:`BANDWIDTH_USE`; the same ones peers report as typical, not measured here on a GPU):

* **decode**, batched: one step reads the dense weights once, each layer's experts that the batch's tokens touch
  (``min(E, B · k)``), and every sequence's KV cache; it also does ``(2 · N_active + A) · B`` FLOPs; its time is
  the larger of the two, and it yields ``B`` tokens;
* **prefill**: ``2 · N_active + A`` FLOPs a token;
* **training**: ``N_active`` times 2 (forward) + 2 (input gradients) + 2 (weight gradients, full fine-tuning
  only) + 2 (recompute, with checkpointing) FLOPs a token, plus 2 for the old log-probs and 2 for the reference;
  and ``A`` times 1 (forward) + 2 (backward) + 1 (recompute), plus 1 for each no-grad pass.

``A`` (:func:`attention_flops`) is the attention's own forward FLOPs a token, which grow with the context: the
scores and the weighted values, ``4 · heads · head_dim`` a key attended, averaged over the positions of a causal
sequence of the step's length (a sliding-window layer attends at most its window). At 4k tokens it adds ~6 % to
gpt-oss-20b's forward; on a small model with long episodes it can match the weights' FLOPs.

A step is rollout (generated tokens at the decode rate, prompts at the prefill rate, or — if longer — every turn
of one episode in series with its tool latency), the update, and the weight sync; the async pipeline overlaps
rollout and update. Models held beside the policy (a distillation teacher, a checkpoint opponent:
:func:`other_models`) are counted whole on every trainer device. Token counts are upper bounds from the config
(every turn generates ``max_new_tokens``, every episode reaches ``max_seq_len``) unless ``gen_tokens`` /
``seq_tokens`` (an episode's mean generated and total tokens, e.g. measured) are given. What this leaves out:
docs/plan.md.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from transformers import GptOssConfig

from harmonyrl.config import RunConfig
from harmonyrl.engine.config import LocalEngineConfig
from harmonyrl.learn.footprint import GIB, Footprint, Plan, estimate, parameter_count
from harmonyrl.models.real import load_config
from harmonyrl.plan.hardware import Hardware
from harmonyrl.tasks.ecosystems.textarena_config import TextArenaEnvConfig

TRAIN_MFU = 0.4
PREFILL_MFU = 0.5
BANDWIDTH_USE = 0.7
HEADROOM = 0.9
"""Fraction of a device's memory a plan fills (the rest: allocator fragmentation, the CUDA context, NCCL)."""
DEGREES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


@dataclass(frozen=True)
class Layout:
    train_devices: int
    """FSDP degree of the trainer."""
    rollout_devices: int
    """Devices of a separate rollout engine (0: colocated with the trainer)."""
    tensor_parallel: int
    """The rollout engine's tensor parallelism (1 when colocated)."""

    @property
    def devices(self) -> int:
        return self.train_devices + self.rollout_devices


@dataclass(frozen=True)
class StepTime:
    rollout_s: float
    update_s: float
    sync_s: float
    overlapped: bool
    """True with the async pipeline: rollout and update run at once."""

    @property
    def total_s(self) -> float:
        work = max(self.rollout_s, self.update_s) if self.overlapped else self.rollout_s + self.update_s
        return work + self.sync_s


@dataclass(frozen=True)
class RunPlan:
    """Everything ``harmonyrl plan`` prints (GiB, tokens/s, seconds, hours)."""

    model: str
    hardware: Hardware
    parameters: int
    active_parameters: int
    memory: Footprint
    """Per trainer device, in the chosen layout."""
    rollout_memory_gib: float
    """Per rollout device of a separate engine (0 when colocated)."""
    fits: bool
    layout: Layout
    decode_tokens_s: float
    prefill_tokens_s: float
    train_tokens_s: float
    step: StepTime
    steps: int
    price: float | None
    notes: tuple[str, ...] = ()
    """What the figures leave out for this config."""

    @property
    def hours(self) -> float:
        return self.steps * self.step.total_s / 3600

    @property
    def device_hours(self) -> float:
        return self.hours * self.layout.devices

    @property
    def cost(self) -> float | None:
        return None if self.price is None else self.device_hours * self.price


def trainer_plan(run: RunConfig, engine: Literal["shared", "copy", "none"] | None = None) -> Plan:
    """The memory model's :class:`Plan` for ``run``'s trainer device (module docstring)."""
    lora, bf16 = run.model.lora, run.model.precision == "bf16"
    rows = min(run.rl.micro_batch, run.rollout.tasks_per_step * run.rollout.group_size)
    local = run.rollout.engine if isinstance(run.rollout.engine, LocalEngineConfig) else None
    engine_bytes = 2.0 if local is None or local.dtype == "bfloat16" else 4.0
    base_bytes = 2.0 if lora is not None and bf16 else 4.0
    if engine is None:  # the embedded engine shares the trainer's weights in the synchronous pipeline, same dtype
        same = engine_bytes == base_bytes and run.rl.async_.max_staleness == 0
        engine = "none" if local is None else ("shared" if same else "copy")
    reference: Literal["shared", "copy", "none"] = "none"
    if run.rl.kl.coef > 0:
        reference = "shared" if lora is not None else "copy"
    return Plan(
        lora_rank=None if lora is None else lora.r,
        lora_targets=() if lora is None else tuple(lora.targets),
        weight_bytes=base_bytes,
        activation_bytes=2 if bf16 else 4,
        checkpointing=run.model.gradient_checkpointing,
        tokens=rows * run.rollout.max_seq_len,
        reference=reference,
        engine=engine,
        engine_bytes=engine_bytes,
        kv_sequences=local.max_batch if local is not None else 1,
        kv_length=run.rollout.max_seq_len,
    )


def plan_run(
    run: RunConfig,
    config: GptOssConfig,
    label: str,
    hardware: Hardware,
    *,
    price: float | None = None,
    tool_latency_s: float = 0.0,
    gen_tokens: float | None = None,
    seq_tokens: float | None = None,
) -> RunPlan:
    """The plan of ``run`` with the model ``config`` on ``hardware`` (module docstring)."""
    capacity = hardware.memory_gib * HEADROOM * GIB
    colocated = trainer_plan(run)
    others = other_models(run)
    whole = dataclasses.replace(estimate(config, colocated), other_models=others)
    if colocated.engine != "none" and whole.total <= capacity:
        layout, memory, rollout_gib = Layout(1, 0, 1), whole, 0.0
    else:
        separate = trainer_plan(run, engine="none")
        alone = dataclasses.replace(estimate(config, separate), other_models=others)
        fsdp = next((f for f in DEGREES if _sharded(alone, f).total <= capacity), DEGREES[-1])
        memory = _sharded(alone, fsdp)
        tp, rollout_gib = _rollout_devices(config, dataclasses.replace(separate, engine="copy"), capacity)
        layout = Layout(fsdp, tp, tp)
    fits = memory.total <= capacity and rollout_gib * GIB <= capacity
    active = active_parameters(config)
    attention = attention_flops(config, seq_tokens if seq_tokens is not None else run.rollout.max_seq_len)
    peak = (hardware.bf16_tflops if run.model.precision == "bf16" else hardware.fp32_tflops) * 1e12
    engine_bytes = 2.0 if colocated.engine_bytes == 2 else 4.0
    decode = decode_rate(config, run, hardware, engine_bytes, peak, attention) * layout.tensor_parallel
    prefill = layout.tensor_parallel * peak * PREFILL_MFU / (2 * active + attention)
    recompute = colocated.checkpointing
    per_token = active * (4 + 2 * (colocated.lora_rank is None) + 2 * recompute) + attention * (3 + recompute)
    no_grad_passes = 1 + (colocated.reference != "none")
    scoring = (2 * active + attention) * no_grad_passes
    train = layout.train_devices * peak * TRAIN_MFU / per_token
    step = step_time(run, config, decode, prefill, train, scoring / per_token, hardware, tool_latency_s,
                     (gen_tokens, seq_tokens), separate=layout.rollout_devices > 0)  # fmt: skip
    total = parameter_count(config)[0]
    return RunPlan(label, hardware, total, active, memory, rollout_gib, fits, layout, decode, prefill, train, step,
                   run.rl.steps, price, notes(run, gen_tokens))  # fmt: skip


def other_models(run: RunConfig) -> float:
    """Bytes of the models ``run`` holds beside the policy on the trainer's device, read from their checkpoints'
    ``config.json``: a distillation teacher (``rl.distill.teacher``: every parameter in the dtype of the student's
    base weights, as it is loaded) and a checkpoint opponent (``env.opponent``: its own embedded engine's weights
    at the engine's dtype and its KV cache, ``max_batch`` sequences of ``max_seq_len``)."""
    plan = trainer_plan(run)
    total = 0.0
    if run.rl.distill is not None:
        teacher = dataclasses.replace(plan, lora_rank=None, reference="none", engine="none")
        total += estimate(load_config(run.rl.distill.teacher), teacher).weights
    if isinstance(run.env, TextArenaEnvConfig) and (opponent := run.env.opponent_checkpoint) is not None:
        engine = estimate(load_config(opponent), dataclasses.replace(plan, lora_rank=None, engine="copy"))
        total += engine.engine_weights + engine.kv_cache
    return total


def notes(run: RunConfig, gen_tokens: float | None) -> tuple[str, ...]:
    """What the plan leaves out for ``run``."""
    out = []
    if run.model.attention in ("eager", "harmonyrl_eager"):
        kernel = run.model.attention
        out.append(f"model.attention={kernel} materialises [rows, heads, T, T] scores, which the activation "
                   "figure leaves out (the O(T) kernels: harmonyrl_sink_sdpa, harmonyrl_flex_sink)")  # fmt: skip
    if gen_tokens is None:
        out.append("token counts are the config's bounds (every turn max_new_tokens, every episode max_seq_len); "
                   "--gen-tokens gives a measured mean")  # fmt: skip
    return tuple(out)


def _sharded(f: Footprint, degree: int) -> Footprint:
    """``f`` on each of ``degree`` FSDP devices: what is sharded divided, activations and the engine as they are."""
    split = ("weights", "adapters", "master", "grads", "optimizer", "reference")
    return dataclasses.replace(f, **{k: getattr(f, k) / degree for k in split})


def _rollout_devices(config: GptOssConfig, plan: Plan, capacity: float) -> tuple[int, float]:
    """(tensor parallelism, GiB per device) of the smallest separate engine holding bf16 weights and the KV cache."""
    engine = estimate(config, dataclasses.replace(plan, engine_bytes=2.0))
    need = engine.engine_weights + engine.kv_cache
    tp = next((t for t in (1, 2, 4, 8, 16) if need / t <= capacity), 16)
    return tp, need / tp / GIB


def active_parameters(config: GptOssConfig) -> int:
    """Parameters one token passes through: attention, router, the routed experts, the unembedding."""
    h, heads, kv, hd = config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim
    attention = h * hd * (2 * heads + 2 * kv)
    experts = config.num_experts_per_tok * 3 * h * config.intermediate_size
    return int(config.num_hidden_layers * (attention + experts + h * config.num_local_experts) + config.vocab_size * h)


def attention_flops(config: GptOssConfig, length: float) -> float:
    """Forward FLOPs a token of the attention itself (scores ``QKᵀ`` and weighted values ``PV``: ``2 + 2`` FLOPs per
    query channel and key attended), averaged over the positions of a causal sequence of ``length`` tokens: position
    ``t`` attends ``min(t, W)`` keys in a layer with sliding window ``W``, ``t`` in a full-attention layer (the sink is
    one logit, not counted). Weights' FLOPs are :func:`active_parameters`' business."""
    n = max(1, round(length))
    channels = config.num_attention_heads * config.head_dim
    types = config.layer_types or ["full_attention"] * config.num_hidden_layers
    window = config.sliding_window or n

    def mean_keys(w: int) -> float:  # (1/n) Σ_{t=1..n} min(t, w)
        w = min(w, n)
        return (w * (w + 1) / 2 + (n - w) * w) / n

    keys = sum(mean_keys(window) if t == "sliding_attention" else mean_keys(n) for t in types)
    return 4.0 * channels * keys


def decode_rate(
    config: GptOssConfig, run: RunConfig, hw: Hardware, weight_bytes: float, peak: float, attention: float
) -> float:
    """Tokens/s of batched decode on one device: bandwidth or FLOPs, whichever binds (module docstring);
    ``attention``: :func:`attention_flops` a token."""
    local = run.rollout.engine if isinstance(run.rollout.engine, LocalEngineConfig) else None
    batch = min(run.rollout.tasks_per_step * run.rollout.group_size, local.max_batch if local else 64)
    layers, experts, k = config.num_hidden_layers, config.num_local_experts, config.num_experts_per_tok
    expert = 3 * config.hidden_size * config.intermediate_size * weight_bytes
    total, expert_params = parameter_count(config)
    dense = (total - expert_params) * weight_bytes
    context = run.rollout.max_seq_len / 2  # the average sequence in flight
    window = config.sliding_window or context
    kv_per_token_layer = 2 * config.num_key_value_heads * config.head_dim * weight_bytes
    types = config.layer_types or ["full_attention"] * layers
    kv = sum(min(context, window) if t == "sliding_attention" else context for t in types) * kv_per_token_layer
    read = dense + layers * min(experts, batch * k) * expert + batch * kv
    flops = (2 * active_parameters(config) + attention) * batch
    seconds = max(read / (hw.bandwidth_gbs * 1e9 * BANDWIDTH_USE), flops / peak)
    return batch / seconds


def step_time(
    run: RunConfig,
    config: GptOssConfig,
    decode: float,
    prefill: float,
    train: float,
    scoring_share: float,
    hw: Hardware,
    tool_latency_s: float,
    tokens: tuple[float | None, float | None],
    separate: bool,
) -> StepTime:
    """One RL step's phases in seconds (module docstring). ``scoring_share``: the no-grad passes' FLOPs over the
    update's, per token; ``tokens``: an episode's generated and total tokens (None: the config's bounds);
    ``separate``: the rollout engine is on devices of its own (weights move every step)."""
    r = run.rollout
    episodes = r.tasks_per_step * r.group_size
    gen_tokens, seq_tokens = tokens
    generated = gen_tokens if gen_tokens is not None else min(r.max_turns * r.max_new_tokens, r.max_seq_len)
    length = seq_tokens if seq_tokens is not None else r.max_seq_len
    batch = min(episodes, r.engine.max_batch if isinstance(r.engine, LocalEngineConfig) else 64)
    serial = r.max_turns * (tool_latency_s + r.max_new_tokens * batch / decode)  # one episode's turns, in series
    rollout = max(episodes * generated / decode + episodes * length / prefill, serial)
    update = episodes * length * (run.rl.epochs + scoring_share) / train
    sync = 0.0
    if separate:  # what trained, in bf16, over the devices' link
        moved = estimate(config, dataclasses.replace(trainer_plan(run), engine="shared")).engine_weights
        sync = (moved if run.model.lora is not None else 2 * parameter_count(config)[0]) / (hw.link_gbs * 1e9)
    return StepTime(rollout, update, sync, overlapped=run.rl.async_.max_staleness > 0)
