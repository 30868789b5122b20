"""How the embedded engine holds its weights: the trainer's own tensors (shared), or a copy of its own.

The engine runs a plain ``GptOssForCausalLM`` built on the meta device (no memory) whose parameters are then
*assigned*, not copied: each weight is the tensor the engine was given when that tensor already has the engine's
device and dtype and sharing is on, and a cast copy otherwise. So:

* **shared** (``share=True``; the GPU plan: one bf16 base for trainer, reference and a colocated engine): every
  weight that sits on the engine's device in the engine's dtype is the trainer's tensor, not a copy. With LoRA
  adapters (peft, injected in place) the engine samples ``W + (alpha/r)·BA``: it holds those merged tensors (only
  the adapted ones, computed by :func:`~harmonyrl.models.lora.merged_state_dict`) and shares the rest. A weight
  sync then moves nothing: the trainer updated the tensors in place, the sync hands the same tensors back, and the
  engine only rebuilds what it derives from them (:meth:`LeanForward.refresh`, the compiled step's panels) and
  clears its prefix cache (keys of the old weights). A sync that hands other tensors (a resumed trainer, fresh
  merged adapters) re-points the engine at them; the engine never writes into a tensor it shares.
  Only valid while the trainer does not change the weights during a generation: the synchronous pipeline
  (rollout, then train, then sync). The async pipeline samples old versions while the trainer updates
  (docs/async.md), so it must not share: ``harmonyrl.run.setup.make_engine`` shares only without it, and
  :meth:`LocalEngine.replica` always copies.
* **copied** (``share=False``, the default for a bare ``LocalEngine``, and whenever device or dtype differ): one
  cast copy per tensor, straight to the engine's device and dtype (the engine used to deep-copy the whole model in
  fp32 first, then cast: for a bf16 engine a transient 2x of the fp32 model). An engine that owns its weights lays
  each layer's q, k and v projections out back to back in one tensor, so that the forward runs them as one GEMM over
  a view instead of keeping a fused copy beside them.

:func:`tensor_bytes` counts what the engine holds beyond a given set of tensors (the trainer's), by storage.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping

import torch
from transformers import GptOssConfig, GptOssForCausalLM
from transformers.initialization import no_init_weights

from harmonyrl.models.lora import merged_state_dict


def _target(t: torch.Tensor, dtype: torch.dtype) -> torch.dtype:
    """What ``Module.to(dtype=...)`` would give ``t``: floating tensors cast, integer ones kept."""
    return dtype if t.is_floating_point() else t.dtype


def same_device(a: torch.device, b: torch.device) -> bool:
    """``cuda`` and ``cuda:0`` are one device here (a run's ``device=cuda`` has no index, its tensors have one)."""
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


def storages(tensors: Iterable[torch.Tensor]) -> set[int]:
    """The data pointers of the storages under ``tensors`` (meta tensors have none)."""
    return {t.untyped_storage().data_ptr() for t in tensors if t.device.type != "meta"}


def tensor_bytes(tensors: Iterable[torch.Tensor], exclude: set[int] = frozenset()) -> int:  # type: ignore[assignment]
    """Bytes of the distinct storages under ``tensors``, leaving out those whose data pointer is in ``exclude``."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t.device.type == "meta":
            continue
        storage = t.untyped_storage()
        if storage.data_ptr() not in exclude:
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def _buffers(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Non-persistent buffers (the rotary tables' ``inv_freq``) under plain GptOss names: not in a state dict."""
    persistent = set(model.state_dict())
    return {name.replace(".base_layer", ""): buf for name, buf in model.named_buffers() if name not in persistent}


def build(model: GptOssForCausalLM, device: torch.device, dtype: torch.dtype, share: bool) -> GptOssForCausalLM:
    """A plain ``GptOssForCausalLM`` (eval, no grad) holding ``model``'s weights (LoRA merged) on ``device`` in
    ``dtype``: the given tensors themselves where ``share`` and they already fit, cast copies otherwise."""
    config: GptOssConfig = copy.deepcopy(model.config)
    config._attn_implementation = "eager"  # the engine runs its own attention; the constructor checks the name
    with torch.device("meta"), no_init_weights():
        plain = GptOssForCausalLM(config)
    plain.eval().requires_grad_(False)
    source = storages([*model.parameters(), *model.buffers()])
    state = merged_state_dict(model)
    tensors: dict[str, torch.Tensor] = {}
    for name, t in {**state, **_buffers(model)}.items():
        fits = same_device(t.device, device) and t.dtype == _target(t, dtype)
        fresh = t.device.type != "meta" and t.untyped_storage().data_ptr() not in source  # e.g. merged W + BA
        if fits and (share or fresh):
            tensors[name] = t.detach()
        else:
            tensors[name] = t.detach().to(device=device, dtype=_target(t, dtype), copy=True)
    if not share:
        _fuse_qkv(tensors, config.num_hidden_layers)
    _assign(plain, tensors)
    return plain


def _fuse_qkv(tensors: dict[str, torch.Tensor], layers: int) -> None:
    """Put each layer's q, k, v weights back to back in one new tensor and replace them by views of it (the engine
    owns these copies, so nothing else sees the layout)."""
    for i in range(layers):
        names = [f"model.layers.{i}.self_attn.{p}_proj.weight" for p in "qkv"]
        fused = torch.cat([tensors[n] for n in names])
        row = 0
        for n in names:
            rows = tensors[n].shape[0]
            tensors[n] = fused[row : row + rows]
            row += rows


def _assign(plain: torch.nn.Module, tensors: Mapping[str, torch.Tensor]) -> None:
    """Make each named parameter / buffer of ``plain`` the given tensor (no copy); every one must be named."""
    own = {name for name, _ in plain.named_parameters()} | {name for name, _ in plain.named_buffers()}
    if set(tensors) != own:
        missing, unknown = sorted(own - set(tensors)), sorted(set(tensors) - own)
        raise KeyError(f"weights do not match the engine's model: missing {missing[:3]}, unexpected {unknown[:3]}")
    for name, t in tensors.items():
        module_name, _, leaf = name.rpartition(".")
        module = plain.get_submodule(module_name)
        if leaf in module._parameters:
            module._parameters[leaf] = torch.nn.Parameter(t, requires_grad=False)
        else:
            module._buffers[leaf] = t


def load(plain: GptOssForCausalLM, state_dict: Mapping[str, torch.Tensor], share: bool, device: torch.device) -> None:
    """New weights into the engine's model (strict key match). Copied: written into the engine's own tensors.
    Shared: each weight becomes the given tensor where it fits (the trainer's own, updated in place: nothing moves),
    else a cast copy; a tensor the engine shares is never written into."""
    params = dict(plain.named_parameters())
    if set(state_dict) != set(params):
        missing, unknown = sorted(set(params) - set(state_dict)), sorted(set(state_dict) - set(params))
        raise KeyError(f"weights do not match the engine's model: missing {missing[:3]}, unexpected {unknown[:3]}")
    with torch.no_grad():
        if not share:
            for name, t in state_dict.items():
                params[name].copy_(t)
            return
        tensors: dict[str, torch.Tensor] = {}
        for name, t in state_dict.items():
            dtype = params[name].dtype
            fits = same_device(t.device, device) and t.dtype == dtype
            tensors[name] = t.detach() if fits else t.detach().to(device=device, dtype=dtype, copy=True)
        tensors |= {name: buf for name, buf in plain.named_buffers()}
        _assign(plain, tensors)
