"""OpenAI's original gpt-oss layout (the ``original/`` folder of openai/gpt-oss-20b and -120b), loaded into the
Hugging Face ``GptOssForCausalLM``.

The folder holds OpenAI's own ``config.json`` (no ``model_type``; ``num_experts``, ``experts_per_token``,
``rope_scaling_factor``, ``rope_ntk_alpha``/``rope_ntk_beta``, ``initial_context_length``) and ``*.safetensors``
files with OpenAI's tensor names. The mapping is transformers' conversion script's
(``models/gpt_oss/convert_gpt_oss_weights_to_hf.py``):

=====================================  =====================================================================
original                               Hugging Face
=====================================  =====================================================================
``embedding.weight``                   ``model.embed_tokens.weight``
``unembedding.weight``                 ``lm_head.weight``
``norm.scale``                         ``model.norm.weight``
``block.N.attn.norm.scale``            ``model.layers.N.input_layernorm.weight``
``block.N.attn.qkv.{weight,bias}``     ``q_proj``, ``k_proj``, ``v_proj`` (rows split H·d, K·d, K·d)
``block.N.attn.out.{weight,bias}``     ``model.layers.N.self_attn.o_proj.*``
``block.N.attn.sinks``                 ``model.layers.N.self_attn.sinks``
``block.N.mlp.norm.scale``             ``model.layers.N.post_attention_layernorm.weight``
``block.N.mlp.gate.{weight,bias}``     ``model.layers.N.mlp.router.*``
``block.N.mlp.mlp1_weight.{blocks,scales}``  ``...experts.gate_up_proj`` (MXFP4, dequantised + transposed)
``block.N.mlp.mlp1_bias``              ``...experts.gate_up_proj_bias``
``block.N.mlp.mlp2_weight.{blocks,scales}``  ``...experts.down_proj``
``block.N.mlp.mlp2_bias``              ``...experts.down_proj_bias``
=====================================  =====================================================================

The MXFP4 blocks have the same ``[E, Out, In/32, 16]`` shape as in the Hugging Face layout and are dequantised by
transformers' ``convert_moe_packed_tensors``. Tensors are read one at a time from memory-mapped files, so the
peak is the fp32 model plus one tensor.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch
from transformers import GptOssConfig, GptOssForCausalLM

from harmonyrl.errors import CheckpointError
from harmonyrl.models.real import build_skeleton

_RENAMES = (
    (r"embedding\.weight", "model.embed_tokens.weight"),
    (r"unembedding\.weight", "lm_head.weight"),
    (r"norm\.scale", "model.norm.weight"),
    (r"block\.(\d+)\.attn\.norm\.scale", r"model.layers.\1.input_layernorm.weight"),
    (r"block\.(\d+)\.attn\.out\.(weight|bias)", r"model.layers.\1.self_attn.o_proj.\2"),
    (r"block\.(\d+)\.attn\.sinks", r"model.layers.\1.self_attn.sinks"),
    (r"block\.(\d+)\.mlp\.norm\.scale", r"model.layers.\1.post_attention_layernorm.weight"),
    (r"block\.(\d+)\.mlp\.gate\.(weight|bias)", r"model.layers.\1.mlp.router.\2"),
    (r"block\.(\d+)\.mlp\.mlp1_bias", r"model.layers.\1.mlp.experts.gate_up_proj_bias"),
    (r"block\.(\d+)\.mlp\.mlp2_bias", r"model.layers.\1.mlp.experts.down_proj_bias"),
)
_QKV = re.compile(r"block\.(\d+)\.attn\.qkv\.(weight|bias)")
_EXPERTS = re.compile(r"block\.(\d+)\.mlp\.(mlp1|mlp2)_weight\.(blocks|scales)")
_PROJ = {"mlp1": "gate_up_proj", "mlp2": "down_proj"}


def is_original_layout(folder: Path) -> bool:
    """True when ``folder/config.json`` is OpenAI's own (``num_experts``, no ``model_type``)."""
    try:
        raw = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(raw, dict) and "model_type" not in raw and "num_experts" in raw


def original_config(raw: dict[str, Any]) -> GptOssConfig:
    """The ``GptOssConfig`` of an original ``config.json``, as transformers' conversion script builds it (YaRN
    from the ``rope_*`` fields; the instruct models' special-token ids)."""
    try:
        kwargs = dict(raw)
        factor, context = float(kwargs.pop("rope_scaling_factor")), int(kwargs.pop("initial_context_length", 4096))
        rope = {
            "rope_type": "yarn",
            "rope_theta": float(kwargs.pop("rope_theta", 150000.0)),
            "factor": factor,
            "beta_fast": float(kwargs.pop("rope_ntk_beta")),
            "beta_slow": float(kwargs.pop("rope_ntk_alpha")),
            "original_max_position_embeddings": context,
            "truncate": False,
        }
        kwargs["num_local_experts"] = kwargs.pop("num_experts")
        kwargs["num_experts_per_tok"] = kwargs.pop("experts_per_token")
        # YaRN's context: the published models' 131072 = 4096 × 32 (transformers warns when they disagree)
        kwargs.setdefault("max_position_embeddings", int(context * factor))
        if int(kwargs["vocab_size"]) > 200002:  # the o200k_harmony ids the instruct models stop and pad on
            kwargs.setdefault("eos_token_id", 200002)  # <|return|>
            kwargs.setdefault("pad_token_id", 199999)  # <|endoftext|>
        # attn_implementation goes through PreTrainedConfig.__post_init__'s **kwargs, which the dataclass type hides
        return GptOssConfig(rope_parameters=rope, attn_implementation="eager", **kwargs)  # type: ignore[call-arg]
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"config.json is not a valid original gpt-oss config: {e!s}".splitlines()[0]) from None


def hf_names(name: str, config: GptOssConfig) -> list[tuple[str, Callable[[torch.Tensor], torch.Tensor]]]:
    """The Hugging Face parameter(s) an original tensor becomes, each with the slice that makes it (qkv splits in
    three); an empty list for names this module does not know. Expert blocks/scales are handled by the loader."""
    for pattern, target in _RENAMES:
        if re.fullmatch(pattern, name):
            return [(re.sub(pattern, target, name), lambda t: t)]
    m = _QKV.fullmatch(name)
    if m is None:
        return []
    q, k = config.head_dim * config.num_attention_heads, config.head_dim * config.num_key_value_heads
    prefix, kind = f"model.layers.{m[1]}.self_attn", m[2]
    return [
        (f"{prefix}.q_proj.{kind}", lambda t: t[:q]),
        (f"{prefix}.k_proj.{kind}", lambda t: t[q : q + k]),
        (f"{prefix}.v_proj.{kind}", lambda t: t[q + k :]),
    ]


def load_original(folder: Path) -> GptOssForCausalLM:
    """Build the model on the meta device and fill it tensor by tensor from the folder's safetensors files."""
    config = original_config(json.loads((folder / "config.json").read_text()))
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CheckpointError("no *.safetensors file beside the original config.json")
    model = build_skeleton(config)
    expected = {n: tuple(p.shape) for n, p in model.named_parameters()}
    state = _read_state(files, config, expected)
    missing = sorted(set(expected) - set(state))
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(f"no tensor in the folder gives '{missing[0]}'{more}")
    model.load_state_dict(state, assign=True, strict=True)
    # the RoPE frequencies are a non-persistent buffer: computed from the config, never stored
    model.model.rotary_emb = type(model.model.rotary_emb)(config)
    return model


def _read_state(
    files: list[Path], config: GptOssConfig, expected: dict[str, tuple[int, ...]]
) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError, safe_open

    state: dict[str, torch.Tensor] = {}
    try:
        with ExitStack() as stack:
            handles = {n: f for p in files for f in [stack.enter_context(safe_open(str(p), "pt"))] for n in f.keys()}  # noqa: SIM118
            for name, handle in handles.items():
                m = _EXPERTS.fullmatch(name)
                if m is not None:
                    if m[3] == "blocks":
                        target = f"model.layers.{m[1]}.mlp.experts.{_PROJ[m[2]]}"
                        state[target] = _dequantised(name, handles, target, expected)
                    continue
                pieces = hf_names(name, config)
                if not pieces:
                    raise CheckpointError(f"tensor '{name}' is not part of the original gpt-oss layout")
                tensor = handle.get_tensor(name)
                for target, part in pieces:
                    state[target] = _fitted(target, part(tensor).to(torch.float32).contiguous(), expected)
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"cannot read safetensors: {e}") from None
    return state


def _dequantised(
    blocks_name: str, handles: dict[str, Any], target: str, expected: dict[str, tuple[int, ...]]
) -> torch.Tensor:
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    scales_name = blocks_name.removesuffix("blocks") + "scales"
    if scales_name not in handles:
        raise CheckpointError(f"MXFP4 tensor '{blocks_name}' has no '{scales_name}' beside it")
    blocks, scales = handles[blocks_name].get_tensor(blocks_name), handles[scales_name].get_tensor(scales_name)
    if blocks.dtype != torch.uint8 or blocks.shape[:-1] != scales.shape or blocks.shape[-1] != 16:
        raise CheckpointError(
            f"'{blocks_name}' {list(blocks.shape)} and '{scales_name}' {list(scales.shape)} are not MXFP4 "
            "blocks [E, Out, In/32, 16] (uint8) and scales [E, Out, In/32]"
        )
    # transformers' decoder: fp4 lookup, ldexp by the scale, transposed to the parameter's [E, In, Out]
    return _fitted(target, convert_moe_packed_tensors(blocks, scales, dtype=torch.float32), expected)


def _fitted(target: str, tensor: torch.Tensor, expected: dict[str, tuple[int, ...]]) -> torch.Tensor:
    if target not in expected:
        raise CheckpointError(f"'{target}' is not a parameter of the model config.json describes")
    if tuple(tensor.shape) != expected[target]:
        raise CheckpointError(
            f"'{target}' has shape {list(tensor.shape)}, config.json implies {list(expected[target])}"
        )
    return tensor
