"""LoRA adapters on a GptOss model through peft, and the merged weights the engine and checkpoints need.

The adapters are injected in place (``peft.inject_adapter_in_model``): the model stays a ``GptOssForCausalLM``, so
every caller keeps its ``config``, its forward and its layers; only the names of the adapted weights change
(``q_proj.weight`` → ``q_proj.base_layer.weight`` beside ``q_proj.lora_A.default.weight``). The attention
projections are ``nn.Linear`` modules (peft's ``target_modules``); the experts' fused ``gate_up_proj`` /
``down_proj`` are 3-D parameters that peft 0.21 adapts through ``target_parameters`` (one rank-r update per
expert). Nothing here mutates the trainer's weights: :func:`merged_state_dict` computes ``W + (alpha/r)·BA``
under the base names, which is what the engine samples from and what a checkpoint's ``model.safetensors`` holds.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
from transformers import GptOssForCausalLM

from harmonyrl.models.attention import CHUNKED_EAGER, KERNELS, kernel_of, set_kernel

ADAPTER = "default"
ATTENTION_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
EXPERT_PARAMETERS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")
ADAPTER_FILE = "lora.safetensors"
"""The adapters' weights in a checkpoint folder (beside the merged ``model.safetensors``); not peft's
``adapter_model.safetensors`` name, which would make ``from_pretrained`` look for a base model elsewhere."""


def _peft() -> Any:
    try:
        import peft
    except ImportError:
        raise ImportError("model.lora needs the optional 'peft' package: pip install 'harmonyrl[lora]'") from None
    return peft


def add_lora(
    model: GptOssForCausalLM, r: int, alpha: float, dropout: float, targets: Sequence[str], seed: int = 0
) -> None:
    """Inject LoRA adapters into ``model`` in place and freeze every other parameter.

    ``targets``: names among :data:`ATTENTION_TARGETS` and ``experts``. The adapters' B starts at zero, so the
    model's function is unchanged until it trains; A's random init is a function of ``seed`` (not of the global
    RNG's state).
    """
    peft = _peft()
    modules = [t for t in targets if t in ATTENTION_TARGETS]
    params = list(EXPERT_PARAMETERS) if "experts" in targets else []
    config = peft.LoraConfig(
        r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=modules or None, target_parameters=params or None
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        peft.inject_adapter_in_model(config, model, adapter_name=ADAPTER)
    for name, p in model.named_parameters():
        p.requires_grad_("lora_" in name)


def has_lora(model: torch.nn.Module) -> bool:
    """Whether ``model`` carries LoRA adapters."""
    return any("lora_" in name for name, _ in model.named_parameters())


def _base_name(key: str) -> str:
    return key.replace(".base_layer", "")


def _deltas(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``(alpha/r)·BA`` of every adapted weight, keyed by the weight's base name."""
    from peft.tuners.lora import LoraLayer

    out: dict[str, torch.Tensor] = {}
    for name, module in model.named_modules():
        if isinstance(module, LoraLayer) and ADAPTER in module.lora_A:
            param = getattr(module, "parameter_name", None) or "weight"  # ParamWrapper names its 3-D parameter
            # each LoRA layer kind (Linear, ParamWrapper) defines get_delta_weight; the base class does not
            out[f"{_base_name(name)}.{param}"] = module.get_delta_weight(ADAPTER)  # type: ignore[attr-defined]
    return out


@torch.no_grad()
def merged_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's weights under the plain GptOss names, with each adapter merged (``W + (alpha/r)·BA``); the
    model itself is not changed. Without adapters: ``model.state_dict()``."""
    state = model.state_dict()
    if not has_lora(model):
        return state
    deltas = _deltas(model)
    merged = {}
    for key, value in state.items():
        if "lora_" in key:
            continue
        base = _base_name(key)
        merged[base] = value + deltas[base].to(value.dtype) if base in deltas else value
    return merged


def adapter_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapters' weights (what a LoRA run trains), keyed as in ``model.state_dict()``."""
    return {k: v for k, v in model.state_dict().items() if "lora_" in k}


def load_adapters(model: torch.nn.Module, adapters: dict[str, torch.Tensor]) -> None:
    """Load saved adapter weights into ``model``'s adapters; every adapter must be given, nothing else."""
    own = set(adapter_state_dict(model))
    if set(adapters) != own:
        missing, unknown = sorted(own - set(adapters)), sorted(set(adapters) - own)
        raise ValueError(f"saved adapters do not match model.lora: missing {missing[:2]}, unexpected {unknown[:2]}")
    model.load_state_dict(adapters, strict=False)


def merged_model(model: GptOssForCausalLM) -> GptOssForCausalLM:
    """A plain ``GptOssForCausalLM`` holding ``model``'s merged weights (``model`` itself if it has no adapters)."""
    if not has_lora(model):
        return model
    from transformers.initialization import no_init_weights

    kernel = kernel_of(model)
    config = copy.deepcopy(model.config)
    config._attn_implementation = "eager"  # the constructor checks the name; our own kernels are set after
    with no_init_weights():  # every weight is overwritten below: skip the random initialisation
        plain = GptOssForCausalLM(config)
    if kernel in KERNELS or kernel in CHUNKED_EAGER.values():  # a checkpointed trainer's chunked eager too
        set_kernel(plain, kernel)
    first = next(model.parameters())
    torch.nn.Module.to(plain, device=first.device, dtype=first.dtype)  # in place (PreTrainedModel.to types unbound)
    plain.load_state_dict(merged_state_dict(model), strict=True)
    plain.train(model.training)
    return plain
