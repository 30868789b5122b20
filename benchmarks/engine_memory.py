"""What the embedded engine holds beside the trainer's model: measured on a scaled gpt-oss-20b geometry, and the
same arithmetic for the real 20b (issue 38 item 2).

Measured: a 2-layer gpt-oss geometry (one sliding layer, window 128, one full; 32 experts top-4; hidden and
expert width 288, 8 heads / 1 KV head of 64; vocab 2048) with real random tensors, engines of 8 slots x 2048
positions. The engine's bytes are counted by storage, leaving out the trainer model's: by walking every tensor
reachable from the engine object (an independent count, which also runs on older versions of the engine) and by
``LocalEngine.memory`` (by role). Arms: fp32 copy (eager torch decode, and the compiled step's panels), fp32
shared, bf16 copy of an fp32 model, bf16 shared with a bf16 model.

Analytic: the same roles for gpt-oss-20b itself, bf16 engine beside a bf16 trainer on one GPU (the GPU plan),
64 slots x 8192 positions, before (deep copy, fused q/k/v, two re-laid-out expert copies, full-length KV on every
layer) and after (shared weights, each expert once, ring KV on sliding layers).

Run: ``python benchmarks/engine_memory.py`` (~1 min on 2 cores; prints a table and ``RESULT`` lines).
"""

from __future__ import annotations

import dataclasses
import gc
from typing import Any

import torch
from transformers import GptOssConfig, GptOssForCausalLM

from harmonyrl.engine.local.engine import LocalEngine
from harmonyrl.models.synthetic import GPT_OSS_20B, scaled

SLOTS, POSITIONS = 8, 2048
GIB, MIB = 2**30, 2**20


def geometry() -> dict[str, Any]:
    cfg = scaled(GPT_OSS_20B, num_hidden_layers=2, hidden_size=288, intermediate_size=288, num_attention_heads=8,
                 num_key_value_heads=1, vocab_size=2048)  # fmt: skip
    cfg.pop("quantization_config")
    cfg["rope_scaling"] = cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 150000.0}
    return cfg


def model(dtype: torch.dtype) -> GptOssForCausalLM:
    config = GptOssConfig(**geometry())
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return GptOssForCausalLM(config).to(dtype).eval()


def reachable_bytes(root: object, exclude: set[int]) -> int:
    """Bytes of the distinct tensor storages reachable from ``root`` (attributes, containers, modules, dataclasses),
    leaving out storages whose data pointer is in ``exclude``."""
    seen_obj: set[int] = set()
    storages: dict[int, int] = {}
    stack = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen_obj:
            continue
        seen_obj.add(id(obj))
        if isinstance(obj, torch.Tensor):
            if obj.device.type != "meta" and (ptr := obj.untyped_storage().data_ptr()) not in exclude:
                storages[ptr] = obj.untyped_storage().nbytes()
            continue
        if isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend(obj)
        elif isinstance(obj, torch.nn.Module):
            stack.extend([*obj.parameters(), *obj.buffers(), *vars(obj).values()])
        elif dataclasses.is_dataclass(obj) or (
            hasattr(obj, "__dict__") and type(obj).__module__.startswith("harmonyrl")
        ):
            stack.extend(vars(obj).values())
    return sum(storages.values())


def storages_of(m: torch.nn.Module) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in (*m.parameters(), *m.buffers())}


def measure() -> list[tuple[str, int, int, dict[str, int] | None]]:
    """(arm, trainer model bytes, engine bytes by walking, engine bytes by role or None)."""
    rows = []
    arms: list[tuple[str, torch.dtype, torch.dtype, str, bool]] = [
        ("fp32 copy, torch decode", torch.float32, torch.float32, "torch", False),
        ("fp32 copy, native decode", torch.float32, torch.float32, "native", False),
        ("fp32 shared, torch decode", torch.float32, torch.float32, "torch", True),
        ("fp32 shared, native decode", torch.float32, torch.float32, "native", True),
        ("bf16 engine, fp32 model (a copy)", torch.float32, torch.bfloat16, "torch", True),
        ("bf16 shared with bf16 model", torch.bfloat16, torch.bfloat16, "torch", True),
    ]
    for name, model_dtype, engine_dtype, kernel, share in arms:
        m = model(model_dtype)
        held = sum(t.nbytes for t in (*m.parameters(), *m.buffers()))
        kwargs: dict[str, Any] = {"share_weights": share} if share else {}
        try:
            engine = LocalEngine(m, SLOTS, POSITIONS, dtype=engine_dtype, kernel=kernel, **kwargs)  # type: ignore[arg-type]
        except TypeError:  # an engine from before share_weights existed: it always copied
            engine = LocalEngine(m, SLOTS, POSITIONS, dtype=engine_dtype, kernel=kernel)  # type: ignore[arg-type]
        walked = reachable_bytes(engine, storages_of(m))
        roles = dataclasses.asdict(engine.memory(m)) if hasattr(engine, "memory") else None
        rows.append((name, held, walked, roles))
        del engine, m
        gc.collect()
    return rows


def analytic_20b(slots: int = 64, positions: int = 8192) -> dict[str, dict[str, float]]:
    """GiB the engine adds beside a bf16 trainer of gpt-oss-20b (bf16 engine on the same GPU), before and after."""
    c = GPT_OSS_20B
    layers, hid, e, inter = c["num_hidden_layers"], c["hidden_size"], c["num_local_experts"], c["intermediate_size"]
    heads, kvh, d, vocab, window = (
        c["num_attention_heads"],
        c["num_key_value_heads"],
        c["head_dim"],
        c["vocab_size"],
        128,
    )
    qkv = (heads + 2 * kvh) * d * hid
    attn = qkv + heads * d * hid + (heads + 2 * kvh) * d + hid + heads  # q/k/v/o weights, biases, sinks
    gate_up, down = e * hid * 2 * inter, e * inter * hid
    experts = gate_up + down + e * (2 * inter + hid)
    per_layer = attn + experts + hid * e + e + 2 * hid  # + router, norms
    params = layers * per_layer + 2 * vocab * hid + hid
    kv_token_layer = 2 * kvh * d * 2  # keys + values, bf16
    full_layers = sum(1 for i in range(layers) if i % 2 == 1)
    before = {
        "transient fp32 deep copy at start": params * 4 / GIB,
        "weights (bf16 copy)": params * 2 / GIB,
        "fused q/k/v copy": layers * qkv * 2 / GIB,
        "experts de-interleaved copy": layers * gate_up * 2 / GIB,
        "experts dense-decode copy": layers * gate_up * 2 / GIB,
        "KV cache": layers * slots * positions * kv_token_layer / GIB,
    }
    after = {
        "transient fp32 deep copy at start": 0.0,
        "weights (bf16 copy)": 0.0,
        "fused q/k/v copy": 0.0,
        "experts de-interleaved copy": 0.0,
        "experts dense-decode copy": 0.0,
        "KV cache": (full_layers * positions + (layers - full_layers) * window) * slots * kv_token_layer / GIB,
    }
    lora_attention = layers * (qkv + heads * d * hid) * 2 / GIB  # merged copies of q/k/v/o with LoRA on attention
    return {"before": before, "after": after, "lora_attention_merged": {"merged q/k/v/o copies": lora_attention}}


def main() -> None:
    print(f"scaled gpt-oss geometry: {geometry()['num_hidden_layers']} layers, engine {SLOTS} slots x {POSITIONS}")
    print(f"{'arm':34s} {'model MiB':>10s} {'engine MiB':>11s}  by role (MiB)")
    for name, held, walked, roles in measure():
        role = "" if roles is None else "  ".join(f"{k}={v / MIB:.2f}" for k, v in roles.items())
        print(f"{name:34s} {held / MIB:10.2f} {walked / MIB:11.2f}  {role}")
        print(f"RESULT arm={name.replace(' ', '_')} model_mib={held / MIB:.2f} engine_mib={walked / MIB:.2f}")
    figures = analytic_20b()
    print("gpt-oss-20b, bf16 engine beside a bf16 trainer, 64 slots x 8192 positions (GiB):")
    for key in figures["before"]:
        print(f"  {key:36s} before {figures['before'][key]:7.2f}   after {figures['after'][key]:7.2f}")
    held_before = sum(v for k, v in figures["before"].items() if not k.startswith("transient"))
    held_after = sum(figures["after"].values())
    print(f"  held (without the transient)         before {held_before:7.2f}   after {held_after:7.2f}")
    print(f"  with LoRA on q/k/v/o the engine also holds merged copies: {figures['lora_attention_merged']}")
    print(f"RESULT gpt_oss_20b_engine_gib_before={held_before:.2f} after={held_after:.2f}")


if __name__ == "__main__":
    main()
