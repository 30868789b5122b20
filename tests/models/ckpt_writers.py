"""Writers of tiny gpt-oss checkpoints in the layouts real ones come in, for the loader's tests.

* :func:`write_bf16_sharded`: Hugging Face layout, bf16, several shards + ``model.safetensors.index.json``.
* :func:`write_mxfp4`: Hugging Face layout with the experts as MXFP4 ``*_blocks`` + ``*_scales`` (as
  openai/gpt-oss-20b ships them), encoded by :func:`mxfp4_encode`.
* :func:`write_original`: OpenAI's ``original/`` layout (own config.json and tensor names, MXFP4 experts).

MXFP4 (OCP Microscaling spec): 32 values share one power-of-two scale ``s = 2**(byte - 127)``; each value is an
E2M1 number ``{0, 0.5, 1, 1.5, 2, 3, 4, 6}`` with a sign bit, two per byte (element ``2i`` in the low nibble,
``2i+1`` in the high one; codes 8-15 are the negatives), the decoding of transformers' ``FP4_VALUES`` table.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import GptOssForCausalLM

from harmonyrl.models.synthetic import GPT_OSS_20B

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
"""Magnitudes of the 3-bit E2M1 codes 0-7."""
EXPERT_MATRICES = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")
QUANTIZATION_CONFIG = GPT_OSS_20B["quantization_config"]
"""openai/gpt-oss-20b config.json's quantization_config (transformers' conversion script writes the same)."""


def block_exponents(weight: torch.Tensor) -> torch.Tensor:
    """Per 32-block exponent ``e = ceil(log2(amax / 6))`` of ``weight [E, In, Out]``, as ``[E, Out, In/32]``: the
    smallest power of two that puts every value of the block within E2M1's ±6 (no clipping)."""
    grouped = weight.transpose(1, 2).reshape(*weight.shape[:1], weight.shape[2], -1, 32)
    mantissa, exponent = torch.frexp(grouped.abs().amax(-1) / 6)  # x = m * 2**e, m in [0.5, 1)
    return (exponent - (mantissa == 0.5).int()).clamp(-127, 127)  # an exact power of two needs one less


def mxfp4_encode(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight [E, In, Out]`` (fp32) as ``(blocks uint8 [E, Out, In/32, 16], scales uint8 [E, Out, In/32])``,
    each value rounded to the nearest E2M1 multiple of its block's scale (ties to the smaller magnitude)."""
    exps = block_exponents(weight)
    grouped = weight.transpose(1, 2).reshape(*exps.shape, 32)
    q = grouped / torch.exp2(exps.float()).unsqueeze(-1)  # |q| <= 6 by the choice of exponent
    magnitude = (q.abs().unsqueeze(-1) - E2M1).abs().argmin(-1)
    codes = (magnitude + 8 * (q < 0).long()).to(torch.uint8)
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return blocks, (exps + 127).to(torch.uint8)


def mxfp4_state(model: GptOssForCausalLM) -> dict[str, torch.Tensor]:
    """The model's state with each expert matrix replaced by its MXFP4 ``_blocks`` + ``_scales``."""
    state: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        if name.endswith(EXPERT_MATRICES):
            state[f"{name}_blocks"], state[f"{name}_scales"] = mxfp4_encode(tensor.float())
        else:
            state[name] = tensor.to(torch.bfloat16).contiguous()  # the published checkpoint's other tensors
    return state


def write_sharded(state: dict[str, torch.Tensor], folder: Path, shards: int = 2) -> list[str]:
    """``state`` as ``shards`` safetensors files + ``model.safetensors.index.json``; returns the file names."""
    folder.mkdir(parents=True, exist_ok=True)
    names = list(state)
    files = [f"model-{i:05d}-of-{shards:05d}.safetensors" for i in range(1, shards + 1)]
    weight_map = {name: files[i * shards // len(names)] for i, name in enumerate(names)}
    for file in files:
        part = {n: state[n].contiguous() for n in names if weight_map[n] == file}
        save_file(part, str(folder / file), metadata={"format": "pt"})
    index = {"metadata": {"total_size": sum(t.nbytes for t in state.values())}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return files


def write_mxfp4(model: GptOssForCausalLM, folder: Path, quantization_config: bool = True) -> Path:
    """The model as openai/gpt-oss-20b is published: bf16 tensors, MXFP4 experts, two shards with an index and a
    config.json carrying ``quantization_config`` (left out with ``quantization_config=False``)."""
    folder.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    if quantization_config:
        config["quantization_config"] = QUANTIZATION_CONFIG
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    write_sharded(mxfp4_state(model), folder)
    return folder


def write_bf16_sharded(model: GptOssForCausalLM, folder: Path) -> Path:
    """Hugging Face layout in bf16, split by ``save_pretrained`` into shards of at most 100 kB with an index."""
    copy = GptOssForCausalLM(model.config)
    copy.load_state_dict(model.state_dict())
    copy.to(torch.bfloat16).save_pretrained(folder, max_shard_size="100KB")
    return folder


def write_original(model: GptOssForCausalLM, folder: Path) -> Path:
    """The model in OpenAI's original layout (the inverse of transformers' conversion script's mapping)."""
    c = model.config
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(
        json.dumps(
            {
                "num_hidden_layers": c.num_hidden_layers,
                "num_experts": c.num_local_experts,
                "experts_per_token": c.num_experts_per_tok,
                "vocab_size": c.vocab_size,
                "hidden_size": c.hidden_size,
                "intermediate_size": c.intermediate_size,
                "swiglu_limit": c.swiglu_limit,
                "head_dim": c.head_dim,
                "num_attention_heads": c.num_attention_heads,
                "num_key_value_heads": c.num_key_value_heads,
                "sliding_window": c.sliding_window,
                "initial_context_length": 4096,
                "rope_theta": c.rope_parameters["rope_theta"],
                "rope_scaling_factor": 1.0,  # YaRN with factor 1 is plain RoPE, as the tiny source model has
                "rope_ntk_alpha": 1.0,
                "rope_ntk_beta": 32.0,
            }
        )
    )
    sd = model.state_dict()
    out: dict[str, torch.Tensor] = {
        "embedding.weight": sd["model.embed_tokens.weight"],
        "unembedding.weight": sd["lm_head.weight"],
        "norm.scale": sd["model.norm.weight"],
    }
    for i in range(c.num_hidden_layers):
        p, b = f"model.layers.{i}.", f"block.{i}."
        for kind in ("weight", "bias"):
            qkv = [sd[f"{p}self_attn.{x}_proj.{kind}"] for x in "qkv"]
            out[f"{b}attn.qkv.{kind}"] = torch.cat(qkv)
            out[f"{b}attn.out.{kind}"] = sd[f"{p}self_attn.o_proj.{kind}"]
            out[f"{b}mlp.gate.{kind}"] = sd[f"{p}mlp.router.{kind}"]
        out[f"{b}attn.sinks"] = sd[f"{p}self_attn.sinks"]
        out[f"{b}attn.norm.scale"] = sd[f"{p}input_layernorm.weight"]
        out[f"{b}mlp.norm.scale"] = sd[f"{p}post_attention_layernorm.weight"]
        for mlp, proj in (("mlp1", "gate_up_proj"), ("mlp2", "down_proj")):
            out[f"{b}mlp.{mlp}_weight.blocks"], out[f"{b}mlp.{mlp}_weight.scales"] = mxfp4_encode(
                sd[f"{p}mlp.experts.{proj}"].float()
            )
            out[f"{b}mlp.{mlp}_bias"] = sd[f"{p}mlp.experts.{proj}_bias"]
    save_file({k: v.contiguous() for k, v in out.items()}, str(folder / "model.safetensors"))
    return folder
