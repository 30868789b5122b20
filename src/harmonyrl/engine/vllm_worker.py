"""The weight sync's half that runs inside the vLLM server: a worker extension (``--worker-extension-cls
harmonyrl.engine.vllm_worker.WeightSync``) whose methods the client calls through ``/collective_rpc``.

Why: vLLM's own ``reload_weights`` reloads a checkpoint folder layer by layer, counting what each layer's
parameters' ``weight_loader`` loads, then re-runs the layer's weight processing (on CPU: padding and prepacking the
MoE weights into the kernel's layout) and copies the result into the live tensors. vLLM 0.32's GptOss loader
copies two kinds of tensors past those loaders, so the reload counts nothing for their layers, logs
``GptOssRoutedExperts: Failed to load weights`` / ``OAIAttention: Failed to load weights`` and keeps the old ones:

- the fused expert tensors (``mlp.experts.gate_up_proj[_bias]``, ``mlp.experts.down_proj[_bias]``, all experts in
  one tensor). The same loader has a per-expert path (``...mlp.experts.<e>.gate_up_proj``, "streamed" experts)
  that does go through ``GptOssRoutedExperts.weight_loader`` (its TP slicing and ``[H, 2I] -> [2I, H]`` transposes),
  so :func:`stream_experts` hands the reload each expert on its own: vLLM then puts them in its layout itself.
  One step of that layout is skipped on a reload: the CPU MoE kernel prepacks the expert weights into its
  grouped-gemm layout only at the first load (vLLM's unquantized MoE method runs the kernel's
  ``process_weights_after_loading`` only when it builds the kernel, not on a weight update), so after a reload the
  live tensors hold unpacked weights that the kernel reads as packed ones. :func:`prepack_cpu_experts` runs that
  same vLLM step again. Nothing here writes vLLM's internal MoE layout by hand.
- the attention sinks (one float per head, no weight_loader at all): :func:`copy_sinks` copies them into the live
  parameter after the reload (this TP rank's heads, in the parameter's dtype), and into the attention kernel's
  own copy when it keeps one.

:meth:`WeightSync.harmonyrl_load_weights` does both, and fails (the client's sync fails loudly) when vLLM reports a
layer with parameters it did not load (other than the sinks), or the file lacks a sink. A *partial* file (the
client's later syncs: only what trained, whole vLLM layers) loads the layers it has; the others are meant to keep
their values, so the unloaded-layer check is not made, only the sinks it carries are copied, and the CPU MoE prepack
runs only when it carries experts (packing the packed weights again would corrupt them). This module runs in the
server's environment (its own venv, another vLLM version, maybe a GPU node): it imports nothing from harmonyrl and
imports vLLM lazily, so the client can import it for :data:`SYNC_PROTOCOL` without vLLM installed.

``python -m harmonyrl.engine.vllm_worker`` (run by ``scripts/vllm_env.sh`` in the server's venv) checks that the
vLLM there has every API this module uses.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

SYNC_PROTOCOL = 2
"""Version of this extension's RPC methods; the client's preflight refuses a server whose extension differs."""
EXTENSION_CLS = "harmonyrl.engine.vllm_worker.WeightSync"
"""What the server's ``--worker-extension-cls`` must name."""
FUSED_EXPERT_SUFFIXES = (
    ".mlp.experts.gate_up_proj",
    ".mlp.experts.gate_up_proj_bias",
    ".mlp.experts.down_proj",
    ".mlp.experts.down_proj_bias",
)
"""Checkpoint names of GptOss's fused expert tensors (leading dim: the expert)."""
RELOAD_LOGGER = "vllm.model_executor.model_loader.reload"
FAILED = ": Failed to load weights"
NOT_LOADED = "were not loaded from checkpoint"
VLLM_APIS = (
    ("vllm.v1.worker.gpu_worker", "Worker.reload_weights"),
    ("vllm.model_executor.models.gpt_oss", "GptOssModel._try_load_streamed_expert"),
    ("vllm.model_executor.model_loader.reload.layerwise", "finalize_layerwise_reload"),
    ("vllm.model_executor.layers.fused_moe.experts.cpu_moe", "CPUUnquantizedExperts.process_weights_after_loading"),
    ("vllm.distributed", "get_tensor_model_parallel_rank"),
    ("vllm.distributed", "get_tensor_model_parallel_world_size"),
    ("vllm.config.parallel", "ParallelConfig.worker_extension_cls"),
)
"""The vLLM names this extension relies on (``python -m harmonyrl.engine.vllm_worker`` checks them)."""


def stream_experts(weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """``weights`` with each fused expert tensor ``P.mlp.experts.X`` (shape ``[E, ...]``) split into ``E`` tensors
    ``P.mlp.experts.<e>.X``, the names vLLM's GptOss loader loads one expert at a time through the weight_loader;
    every other tensor unchanged."""
    for name, tensor in weights:
        if name.endswith(FUSED_EXPERT_SUFFIXES):
            prefix, _, leaf = name.rpartition(".")
            for expert in range(tensor.shape[0]):
                yield f"{prefix}.{expert}.{leaf}", tensor[expert]
        else:
            yield name, tensor


def checkpoint_sink_name(param_name: str) -> str:
    """The checkpoint name of vLLM's sinks parameter ``param_name`` (vLLM maps ``.self_attn.`` to ``.attn.``)."""
    return param_name.replace(".attn.sinks", ".self_attn.sinks")


def heads_of_rank(sinks: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """This tensor-parallel rank's slice of the per-head ``sinks`` (heads are split evenly, in order)."""
    if sinks.shape[0] % world:
        raise ValueError(f"{sinks.shape[0]} attention heads do not split over {world} tensor-parallel ranks")
    per = sinks.shape[0] // world
    return sinks.narrow(0, rank * per, per)


def copy_sinks(
    model: torch.nn.Module, tensors: Mapping[str, torch.Tensor], rank: int, world: int, partial: bool = False
) -> int:
    """Copy every attention sink of ``tensors`` into ``model``'s sinks parameters in place (and into the attention
    kernel's copy when it holds another tensor); how many parameters. A sinks parameter the file lacks is an error
    (nothing is silently left at its old value), unless the file is ``partial``: then it keeps its value."""
    copied = 0
    for module_name, module in model.named_modules():
        param = module._parameters.get("sinks")
        if param is None:
            continue
        name = checkpoint_sink_name(f"{module_name}.sinks")
        if name not in tensors:
            if partial:
                continue
            raise KeyError(f"the weights have no {name} for vLLM's {module_name}.sinks")
        new = heads_of_rank(tensors[name], rank, world)
        with torch.no_grad():
            param.data.copy_(new)
            held = getattr(getattr(getattr(module, "attn", None), "impl", None), "sinks", None)
            if isinstance(held, torch.Tensor) and held.data_ptr() != param.data_ptr():
                held.copy_(new)  # a kernel that cast the sinks at first use keeps its own copy
        copied += 1
    return copied


def tensor_parallel() -> tuple[int, int]:
    """This worker's tensor-parallel rank and the tensor-parallel world size (vLLM's)."""
    distributed = importlib.import_module("vllm.distributed")
    return distributed.get_tensor_model_parallel_rank(), distributed.get_tensor_model_parallel_world_size()


def prepack_cpu_experts(model: torch.nn.Module) -> int:
    """Run the CPU MoE kernel's own weight processing (the prepack into its grouped-gemm layout) on every MoE layer
    served by vLLM's CPU unquantized experts, as the first load does; how many layers. vLLM 0.32 skips it when
    weights are reloaded (see the module docstring); other kernels are left alone."""
    count = 0
    for module in model.modules():
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        if experts is not None and any(c.__name__ == "CPUUnquantizedExperts" for c in type(experts).__mro__):
            experts.process_weights_after_loading(module)
            count += 1
    return count


class ReloadProblems(logging.Handler):
    """Collects what vLLM's reload reports as not loaded (it only logs it, then keeps the old tensors)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.failed_layers: set[str] = set()
        self.not_loaded: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.endswith(FAILED):
            self.failed_layers.add(message.removesuffix(FAILED))
        elif NOT_LOADED in message:
            self.not_loaded.append(message[:300])


@contextlib.contextmanager
def reload_problems() -> Iterator[ReloadProblems]:
    """Watch vLLM's reload loggers while the block runs."""
    handler, logger = ReloadProblems(), logging.getLogger(RELOAD_LOGGER)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


class WeightSync:
    """Mixed into vLLM's worker class by ``--worker-extension-cls``; called through ``collective_rpc``.

    ``self`` is the vLLM worker (``reload_weights`` and ``model_runner`` are its)."""

    model_runner: Any
    reload_weights: Any

    def harmonyrl_sync_protocol(self) -> int:
        """The version of these methods (the client's preflight compares it with its own)."""
        return SYNC_PROTOCOL

    def harmonyrl_load_weights(self, weights_path: str, partial: bool = False) -> dict[str, int | str]:
        """Load ``weights_path/model.safetensors``, or the ``.safetensors`` file ``weights_path`` (checkpoint
        names, any float dtype: cast to the model's) into the served model: vLLM's reload for all it loads (experts
        streamed one by one), then the sinks. Every tensor, unless ``partial`` (see the module docstring). A failure
        is reported in the answer (``error``), not raised: raised, the RPC would be an HTTP 500 that the client
        retries to no avail."""
        path = Path(weights_path)
        try:
            tensors, sinks = self._harmonyrl_load(
                path if path.suffix == ".safetensors" else path / "model.safetensors", partial
            )
        except Exception as e:  # the RPC boundary: the client fails the step with this message
            return {"protocol": SYNC_PROTOCOL, "error": f"{type(e).__name__}: {e}"[:500]}
        return {"protocol": SYNC_PROTOCOL, "tensors": tensors, "sinks": sinks}

    def _harmonyrl_load(self, path: Path, partial: bool) -> tuple[int, int]:
        from safetensors.torch import load_file

        tensors = load_file(str(path))
        rank, world = tensor_parallel()
        with reload_problems() as problems:
            self.reload_weights(weights_iterator=stream_experts(tensors.items()), is_checkpoint_format=True)
        model = self.model_runner.get_model()
        if not partial and (left := unloaded_parameters(model, problems.failed_layers) or problems.not_loaded):
            raise RuntimeError(f"vLLM did not reload {', '.join(left)}")
        if not partial or any(name.endswith(FUSED_EXPERT_SUFFIXES) for name in tensors):
            prepack_cpu_experts(model)
        return len(tensors), copy_sinks(model, tensors, rank, world, partial)


def unloaded_parameters(model: torch.nn.Module, failed_layers: set[str]) -> list[str]:
    """The parameters vLLM's reload kept at their old values: those of a layer it reported as failed (by class
    name), except the sinks, which :func:`copy_sinks` loads. A failed layer without parameters is fine: its tensors
    are computed, not loaded (the rotary embedding's cos/sin cache)."""
    return sorted(
        f"{module_name}.{name}"
        for module_name, module in model.named_modules()
        if type(module).__name__ in failed_layers
        for name, param in module._parameters.items()
        if param is not None and name != "sinks"
    )


def missing_vllm_apis() -> list[str]:
    """The names of :data:`VLLM_APIS` the installed vLLM lacks."""
    missing = []
    for module_name, attr in VLLM_APIS:
        try:
            obj: Any = importlib.import_module(module_name)
            for part in attr.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError):
            missing.append(f"{module_name}.{attr}")
    return missing


if __name__ == "__main__":
    import sys

    if gone := missing_vllm_apis():
        sys.exit(f"this vLLM lacks what harmonyrl's weight sync uses: {', '.join(gone)}")
    print(f"vLLM has what {EXTENSION_CLS} uses (protocol {SYNC_PROTOCOL})")
