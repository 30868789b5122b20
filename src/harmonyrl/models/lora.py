"""LoRA adapters on a GptOss model through peft, and the merged weights the engine and checkpoints need.

The adapters are injected in place (``peft.inject_adapter_in_model``): the model stays a ``GptOssForCausalLM``, so
every caller keeps its ``config``, its forward and its layers; only the names of the adapted weights change
(``q_proj.weight`` → ``q_proj.base_layer.weight`` beside ``q_proj.lora_A.default.weight``). The attention
projections are ``nn.Linear`` modules (peft's ``target_modules``); the experts' fused ``gate_up_proj`` /
``down_proj`` are 3-D parameters that peft 0.21 adapts through ``target_parameters`` (one rank-r update per
expert). Nothing here mutates the trainer's weights: :func:`merged_state_dict` computes ``W + (alpha/r)·BA``
under the base names, which is what the engine samples from and what a checkpoint's ``model.safetensors`` holds.

Dtypes (docs/memory.md): the adapters are always fp32 (they train: AdamW's small steps need fp32); the frozen base
may be kept in bf16 (:func:`cast_base`; nothing is lost, it never trains). The merged weights are computed in
fp32 and rounded once to the base's dtype.

The reference policy of a LoRA run is this same model with its trained adapter switched off (:func:`run_as`):
the base alone when RL started from untrained adapters (B = 0, a zero update), else the base with a frozen
adapter holding the start's adapter weights (:func:`add_frozen_adapter`; a LoRA SFT warm start): adapter-sized,
never a second copy of the base.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from transformers import GptOssForCausalLM

from harmonyrl.models.attention import CHUNKED_EAGER, KERNELS, kernel_of, set_kernel

ADAPTER = "default"
"""The trained adapter's peft name."""
REFERENCE = "reference"
"""A frozen adapter holding the RL start's adapters (the reference policy after a LoRA SFT warm start)."""
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
    _adapters_to_fp32(model)  # peft makes them in the base's dtype (a bf16 checkpoint's A would train in bf16)
    for name, p in model.named_parameters():
        p.requires_grad_("lora_" in name)


def _adapters_to_fp32(model: torch.nn.Module) -> None:
    for name, p in model.named_parameters():
        if "lora_" in name and p.dtype != torch.float32:
            p.data = p.data.float()  # in place: the parameter object (and any optimizer's reference) is kept


def cast_base(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Keep every parameter outside the adapters in ``dtype`` (in place; the adapters stay fp32, buffers such as
    RoPE's ``inv_freq`` are left alone). For bf16: the frozen base of a bf16 LoRA run, half the bytes of fp32."""
    for name, p in model.named_parameters():
        if "lora_" not in name and p.is_floating_point() and p.dtype != dtype:
            p.data = p.data.to(dtype)


def has_lora(model: torch.nn.Module) -> bool:
    """Whether ``model`` carries LoRA adapters."""
    return any("lora_" in name for name, _ in model.named_parameters())


def _base_name(key: str) -> str:
    return key.replace(".base_layer", "")


def _is_trained_adapter(key: str) -> bool:
    return "lora_" in key and f".{ADAPTER}." in key


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


def adapted_names(model: torch.nn.Module) -> frozenset[str]:
    """The plain GptOss names of the weights the trained adapter adapts (what :func:`merged_state_dict` changes;
    empty without adapters): with LoRA, the only weights that change when the model trains."""
    from peft.tuners.lora import LoraLayer

    return frozenset(
        f"{_base_name(name)}.{getattr(module, 'parameter_name', None) or 'weight'}"
        for name, module in model.named_modules()
        if isinstance(module, LoraLayer) and ADAPTER in module.lora_A
    )


@torch.no_grad()
def merged_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's weights under the plain GptOss names, with the trained adapter merged (``W + (alpha/r)·BA``,
    added in fp32 and rounded once to ``W``'s dtype: bf16 for a bf16 base, where peft gives the experts' delta in
    bf16 already); the model itself is not changed. Without adapters: ``model.state_dict()``."""
    state = model.state_dict()
    if not has_lora(model):
        return state
    deltas = _deltas(model)
    merged = {}
    for key, value in state.items():
        if "lora_" in key:  # the trained adapter's, and a frozen reference adapter's
            continue
        base = _base_name(key)
        if base in deltas:  # for an fp32 base exactly ``value + delta``, as before bf16 bases existed
            merged[base] = (value.to(torch.float32) + deltas[base].to(torch.float32)).to(value.dtype)
        else:
            merged[base] = value
    return merged


def adapter_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The trained adapter's weights (what a LoRA run trains), keyed as in ``model.state_dict()``."""
    return {k: v for k, v in model.state_dict().items() if _is_trained_adapter(k)}


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


def is_zero_update(adapters: Mapping[str, torch.Tensor]) -> bool:
    """Whether adapter weights (as :func:`adapter_state_dict` keys them) add nothing: every B is zero (a fresh
    adapter: B starts at zero)."""
    return all(not bool(v.any()) for k, v in adapters.items() if "lora_B" in k)


def add_frozen_adapter(model: torch.nn.Module, adapters: Mapping[str, torch.Tensor]) -> None:
    """Give ``model`` a second, frozen adapter (:data:`REFERENCE`) holding ``adapters`` (the trained adapter's
    weights at some earlier time, keyed as :func:`adapter_state_dict`), fp32, beside the trained one. The trained
    adapter stays the active one; :func:`run_as` switches to this one. Adapter-sized: the base is shared."""
    peft = _peft()
    own = adapter_state_dict(model)
    if set(adapters) != set(own):
        raise ValueError("the reference adapters do not match the model's adapters (another model.lora?)")
    config = copy.deepcopy(model.peft_config[ADAPTER])  # type: ignore[index]  # set by inject_adapter_in_model
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*multiple adapters.*")  # two adapters is the point
        peft.inject_adapter_in_model(config, model, adapter_name=REFERENCE)  # its random init is overwritten
    _adapters_to_fp32(model)
    frozen = {k.replace(f".{ADAPTER}.", f".{REFERENCE}."): v for k, v in adapters.items()}
    model.load_state_dict(frozen, strict=False)
    for name, p in model.named_parameters():
        p.requires_grad_(_is_trained_adapter(name))


def _tuner_layers(model: torch.nn.Module) -> list[Any]:
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [m for m in model.modules() if isinstance(m, BaseTunerLayer)]


@contextmanager
def run_as(model: torch.nn.Module, adapter: str | None) -> Iterator[torch.nn.Module]:
    """``model`` computing with only ``adapter`` active (None: every adapter off, the base alone), restored on
    exit: the trained adapter active, and every parameter's ``requires_grad`` as it was (peft's switches set
    them, so they are put back exactly)."""
    layers = _tuner_layers(model)
    flags = [(p, p.requires_grad) for p in model.parameters()]
    try:
        for layer in layers:
            if adapter is None:
                layer.enable_adapters(False)
            else:
                layer.set_adapter(adapter, inference_mode=True)
        yield model
    finally:
        for layer in layers:
            layer.set_adapter(ADAPTER)
            layer.enable_adapters(True)
        for p, flag in flags:
            p.requires_grad_(flag)
