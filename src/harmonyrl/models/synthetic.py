"""Checkpoints with a published model's exact geometry and random weights, written without ever holding the model.

No model hub is reachable here, yet memory, load time and kernels must be measured on gpt-oss-20b's and
-120b's real shapes. :func:`write_synthetic` writes a Hugging Face folder that :func:`harmonyrl.models.real.
check_checkpoint` and :func:`harmonyrl.models.load.load_checkpoint` accept like the published one:
``config.json`` (the published config, :data:`GPT_OSS_20B` / :data:`GPT_OSS_120B`), ``model.safetensors.index.json``
and shards of about ``shard_bytes``, with the expert matrices as MXFP4 blocks + scales and everything else in bf16
(the published checkpoints' layout; names and shapes from the meta-device skeleton). Tensors are generated one
at a time, so writing the 20b geometry (~13 GB) needs about one shard of memory.

Values are random but shaped like a trained model's: bf16 weights ~ N(0, 0.02²), norms 1, biases and sinks 0;
MXFP4 nibbles uniform over the 16 codes (|value| ≤ 6) with block exponents 2^-8..2^-6, so dequantised expert
weights have a standard deviation near 0.03 (measured on a small geometry). Nothing learnt is in them: they
measure size and speed only.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from transformers import GptOssConfig

from harmonyrl.models.real import INDEX, build_skeleton, load_config, mxfp4_shapes

_EXPERTS = (".mlp.experts.gate_up_proj", ".mlp.experts.down_proj")

GPT_OSS_20B: dict[str, Any] = {
    "architectures": ["GptOssForCausalLM"],
    "attention_bias": True,
    "attention_dropout": 0.0,
    "eos_token_id": 200002,
    "experts_per_token": 4,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 2880,
    "initial_context_length": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 2880,
    "layer_types": ["sliding_attention", "full_attention"] * 12,
    "max_position_embeddings": 131072,
    "model_type": "gpt_oss",
    "num_attention_heads": 64,
    "num_experts_per_tok": 4,
    "num_hidden_layers": 24,
    "num_key_value_heads": 8,
    "num_local_experts": 32,
    "output_router_logits": False,
    "pad_token_id": 199999,
    "quantization_config": {
        "modules_to_not_convert": [
            "model.layers.*.self_attn",
            "model.layers.*.mlp.router",
            "model.embed_tokens",
            "lm_head",
        ],
        "quant_method": "mxfp4",
    },
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "factor": 32.0,
        "original_max_position_embeddings": 4096,
        "rope_type": "yarn",
        "truncate": False,
    },
    "rope_theta": 150000,
    "router_aux_loss_coef": 0.9,
    "sliding_window": 128,
    "swiglu_limit": 7.0,
    "tie_word_embeddings": False,
    "use_cache": True,
    "vocab_size": 201088,
}
"""openai/gpt-oss-20b's published ``config.json`` (generation-only fields left out): 21 B parameters, 3.6 B active."""

GPT_OSS_120B: dict[str, Any] = {
    **GPT_OSS_20B,
    "layer_types": ["sliding_attention", "full_attention"] * 18,
    "num_hidden_layers": 36,
    "num_local_experts": 128,
}
"""openai/gpt-oss-120b's: the 20b geometry with 36 layers and 128 experts (117 B parameters, 5.1 B active)."""


def scaled(config: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """``config`` with some sizes changed: a dry-run geometry. ``num_hidden_layers`` also resizes ``layer_types``;
    a smaller ``vocab_size`` moves the pad and end ids to its last two ids."""
    out = copy.deepcopy(config)
    out.update(changes)
    layers = int(out["num_hidden_layers"])
    out["layer_types"] = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
    vocab = int(out["vocab_size"])
    if max(out["pad_token_id"], out["eos_token_id"]) >= vocab:
        out["pad_token_id"], out["eos_token_id"] = vocab - 1, vocab - 2
    return out


def write_synthetic(
    folder: Path, config: dict[str, Any], *, seed: int = 0, shard_bytes: int = 4 << 30, mxfp4: bool = True
) -> int:
    """Write a random checkpoint of ``config``'s geometry into ``folder`` (created); returns the bytes written.

    ``mxfp4=False`` stores the expert matrices in bf16 under their parameter names (a dequantised checkpoint).
    """
    folder.mkdir(parents=True, exist_ok=True)
    meta = dict(config)
    if not mxfp4:
        meta.pop("quantization_config", None)
    (folder / "config.json").write_text(json.dumps(meta, indent=2))
    gen = torch.Generator().manual_seed(seed)
    weight_map: dict[str, str] = {}
    shard: dict[str, torch.Tensor] = {}
    size = total = 0
    names: list[str] = []
    for name, tensor in _tensors(load_config(folder), gen, mxfp4):
        shard[name] = tensor
        size += tensor.numel() * tensor.element_size()
        if size >= shard_bytes:
            names.append(_flush(folder, shard, weight_map, len(names)))
            total, size, shard = total + size, 0, {}
    if shard:
        names.append(_flush(folder, shard, weight_map, len(names)))
        total += size
    count = len(names)
    for old in names:  # shards are named before their count is known: give them the usual -of-N names
        final = old.replace("-of-XXXXX", f"-of-{count:05d}")
        (folder / old).rename(folder / final)
        weight_map.update({k: final for k, v in weight_map.items() if v == old})
    (folder / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    return total


def _flush(folder: Path, shard: dict[str, torch.Tensor], weight_map: dict[str, str], index: int) -> str:
    name = f"model-{index + 1:05d}-of-XXXXX.safetensors"
    save_file(shard, str(folder / name), metadata={"format": "pt"})
    weight_map.update(dict.fromkeys(shard, name))
    return name


def _tensors(config: GptOssConfig, gen: torch.Generator, mxfp4: bool) -> Iterator[tuple[str, torch.Tensor]]:
    """Every stored tensor of the checkpoint, in the skeleton's order, generated one at a time."""
    for name, param in build_skeleton(config).named_parameters():
        shape = tuple(param.shape)
        packed = mxfp4_shapes(shape) if mxfp4 and name.endswith(_EXPERTS) else None
        if packed is not None:
            blocks, scales = packed
            yield f"{name}_blocks", torch.randint(0, 256, blocks, generator=gen, dtype=torch.uint8)
            yield f"{name}_scales", torch.randint(119, 122, scales, generator=gen, dtype=torch.uint8)
        elif name.endswith(("norm.weight", "layernorm.weight")):
            yield name, torch.ones(shape, dtype=torch.bfloat16)
        elif name.endswith(("bias", "sinks")):
            yield name, torch.zeros(shape, dtype=torch.bfloat16)
        else:
            yield name, (torch.randn(shape, generator=gen) * 0.02).to(torch.bfloat16)
