"""Tiny GPT-OSS presets built from transformers' ``GptOssConfig``.

The architecture is the real one — attention sinks, top-k MoE router with SwiGLU-clamped experts,
alternating sliding-window / full-attention layers, grouped KV heads — only smaller, so the identical
code path runs on a laptop CPU. Checkpoints are plain safetensors + config.json that
``AutoModelForCausalLM.from_pretrained`` loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from transformers import GptOssConfig, GptOssForCausalLM

from harmonyrl.errors import CheckpointError
from harmonyrl.models.load import load_checkpoint
from harmonyrl.models.lora import ADAPTER_FILE, adapter_state_dict, has_lora, merged_state_dict

PresetName = Literal["nano", "micro", "small"]
HeadInit = Literal["random", "embedding"]
"""How the (untied) LM head starts: transformers' random init, or a copy of the input embedding's rows."""


@dataclass(frozen=True)
class Preset:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    num_local_experts: int
    num_experts_per_tok: int
    sliding_window: int


PRESETS: dict[PresetName, Preset] = {
    # fast unit tests: ~0.3 M parameters
    "nano": Preset(64, 2, 4, 2, 16, 64, 4, 2, 32),
    # the default demo: ~2 M parameters, trains in minutes on 2 CPU cores
    "micro": Preset(128, 4, 4, 2, 32, 128, 4, 2, 64),
    # a step up for longer experiments
    "small": Preset(256, 6, 8, 2, 32, 256, 8, 2, 128),
}


def build_config(
    preset: PresetName, vocab_size: int, pad_token_id: int, eos_token_id: int, max_positions: int = 2048
) -> GptOssConfig:
    p = PRESETS[preset]
    layer_types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(p.num_hidden_layers)]
    # attn_implementation goes through PreTrainedConfig.__post_init__'s **kwargs, which the dataclass type hides
    return GptOssConfig(  # type: ignore[call-arg]
        vocab_size=vocab_size,
        hidden_size=p.hidden_size,
        intermediate_size=p.intermediate_size,
        num_hidden_layers=p.num_hidden_layers,
        num_attention_heads=p.num_attention_heads,
        num_key_value_heads=p.num_key_value_heads,
        head_dim=p.head_dim,
        num_local_experts=p.num_local_experts,
        num_experts_per_tok=p.num_experts_per_tok,
        sliding_window=p.sliding_window,
        layer_types=layer_types,
        max_position_embeddings=max_positions,
        # plain RoPE: YaRN scaling only matters for contexts far longer than ours
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        pad_token_id=pad_token_id,
        eos_token_id=eos_token_id,
        tie_word_embeddings=False,
        attn_implementation="eager",
        output_router_logits=False,
    )


def build_model(config: GptOssConfig, seed: int, head_init: HeadInit = "random") -> GptOssForCausalLM:
    """Randomly initialised model in fp32, deterministic given ``seed``.

    ``head_init="embedding"`` starts the LM head as a copy of the input embedding (the weights stay two
    parameters, untied, as GPT-OSS's are): a token's output row then points along its input row, so the
    residual stream carrying a token already scores that token highest and copying a prompt token is an
    attention pattern to learn, not one aligned (embedding, head) row pair per token. With a 201k vocabulary,
    where each of o200k's ~1,100 number tokens (digits in groups of up to three) is seen a handful of times in
    a warm start, that is what lets a tiny model copy numbers (docs/o200k.md). The random draws are the same
    either way: the copy replaces the head's after init.
    """
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = GptOssForCausalLM(config)
    model.float()  # in place
    if head_init == "embedding":
        with torch.no_grad():
            model.lm_head.weight.copy_(model.model.embed_tokens.weight)
    return model


def load_model(path: Path, dtype: torch.dtype = torch.float32, device: torch.device | None = None) -> GptOssForCausalLM:
    """Load a gpt-oss checkpoint folder in ``dtype`` (default fp32) onto ``device`` (default the CPU): one written
    by :func:`save_model`, a Hugging Face one (bf16 or fp32, sharded or not, MXFP4 experts dequantised) or OpenAI's
    original layout (:mod:`harmonyrl.models.load`)."""
    if not (path / "config.json").is_file():
        raise CheckpointError(f"'{path}' is not a checkpoint folder (no config.json inside)")
    return load_checkpoint(path, dtype=dtype, device=device)


def check_max_seq_len(config: GptOssConfig, max_seq_len: int, source: str) -> None:
    """A one-line :class:`CheckpointError` when episodes of ``max_seq_len`` tokens would run past the positions the
    model was built for (RoPE extrapolates silently: the engine would decode, just wrongly). A fresh preset model
    is built with ``max(1024, max_seq_len)`` positions, so this concerns loaded checkpoints."""
    limit = int(config.max_position_embeddings)
    if max_seq_len > limit:
        raise CheckpointError(
            f"rollout.max_seq_len={max_seq_len} exceeds the max_position_embeddings={limit} of {source}; "
            f"set rollout.max_seq_len<={limit}"
        )


def save_model(model: GptOssForCausalLM, path: Path) -> None:
    """A checkpoint folder ``AutoModelForCausalLM.from_pretrained`` loads as a plain GptOss. With LoRA adapters:
    the merged weights, plus the adapters alone in ``lora.safetensors`` (what a resume continues training)."""
    if not has_lora(model):
        model.save_pretrained(path, safe_serialization=True)
        return
    from safetensors.torch import save_file

    model.save_pretrained(path, safe_serialization=True, state_dict=merged_state_dict(model))
    save_file({k: v.contiguous() for k, v in adapter_state_dict(model).items()}, path / ADAPTER_FILE)


def num_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
