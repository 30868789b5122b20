"""Check a real gpt-oss checkpoint folder against the model transformers would build from its config.

Nothing is loaded: the ``GptOssForCausalLM`` skeleton is built on the ``meta`` device (parameters carry shapes,
no storage — gpt-oss-20b's 20.9 B parameters would otherwise take 84 GB in fp32), the index contributes tensor
names, and shard files contribute shapes through their safetensors headers only (``safe_open`` memory-maps the
file; ``get_slice(...).get_shape()`` reads no tensor data). So the check runs in seconds on a laptop, against a
folder holding just ``config.json`` and ``model.safetensors.index.json``, some of the shards, or all of them.

Quantised experts. OpenAI's published checkpoints store each layer's expert matrices in MXFP4, not under the
parameter names the model has (``model.safetensors.index.json`` of openai/gpt-oss-20b; the format is decoded
by ``transformers.integrations.mxfp4.convert_moe_packed_tensors``). For an expert parameter
``...mlp.experts.{gate_up_proj,down_proj}`` of shape ``[E, In, Out]`` the folder holds:

* ``{name}_blocks`` ``uint8 [E, Out, In / 32, 16]`` — 32 four-bit values per block, two per byte;
* ``{name}_scales`` ``uint8 [E, Out, In / 32]`` — one shared power-of-two exponent per block (biased by 127).

Dequantising gives ``[E, Out, In]``, transposed to the parameter's ``[E, In, Out]``. The biases
(``{name}_bias``) stay unquantised under the parameter's own name. For gpt-oss-20b that is gate_up_proj
``[32, 2880, 5760]`` ↔ blocks ``[32, 5760, 90, 16]`` + scales ``[32, 5760, 90]``, and down_proj
``[32, 2880, 2880]`` ↔ blocks ``[32, 2880, 90, 16]`` + scales ``[32, 2880, 90]``. A checkpoint saved
dequantised (e.g. by :func:`harmonyrl.models.tiny_gpt_oss.save_model`) uses the plain names; both are accepted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import GptOssConfig, GptOssForCausalLM

from harmonyrl.errors import CheckpointError

INDEX = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
MXFP4_BLOCK = 32
"""Values per MXFP4 block; each block is stored as 16 bytes plus one scale byte."""
_EXPERT_MATRICES = (".mlp.experts.gate_up_proj", ".mlp.experts.down_proj")
_REQUIRED_INTS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "num_local_experts",
    "num_experts_per_tok",
)

Shape = tuple[int, ...]


@dataclass(frozen=True)
class ShapeMismatch:
    name: str
    expected: Shape
    found: Shape


@dataclass(frozen=True)
class CheckpointReport:
    """What a folder holds against what its config implies. ``ok`` means nothing missing, unexpected or
    mis-shaped among what could be checked (names need the index or shards; shapes need the shard files)."""

    folder: Path
    config: GptOssConfig
    num_parameters: int
    """Parameters of the skeleton, counted dequantised (what training would hold)."""
    tensors_named: int
    """Tensors the checkpoint declares (index and/or shard headers); 0 if it has neither."""
    shapes_checked: int
    quantised: tuple[str, ...]
    """Parameters stored as MXFP4 blocks + scales."""
    missing: tuple[str, ...]
    unexpected: tuple[str, ...]
    shape_mismatches: tuple[ShapeMismatch, ...]
    absent_shards: tuple[str, ...] = field(default=())
    """Shard files the index names that are not in the folder (their tensors' shapes went unchecked)."""

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.shape_mismatches)


def load_config(folder: Path) -> GptOssConfig:
    """The folder's ``config.json`` as a ``GptOssConfig``; a one-line :class:`CheckpointError` if it is absent,
    not JSON, not gpt-oss, or missing a size the skeleton needs."""
    path = folder / "config.json"
    if not folder.is_dir():
        raise CheckpointError(f"'{folder}' is not a folder")
    if not path.is_file():
        raise CheckpointError(f"'{folder}' has no config.json")
    try:
        raw = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"'{path}' is not valid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"'{path}' must hold a JSON object")
    if "model_type" not in raw and "num_experts" in raw:
        raise CheckpointError(
            f"'{path}' is OpenAI's original layout: check-checkpoint reads the Hugging Face layout "
            "(model.init_from and eval --checkpoint load both)"
        )
    if raw.get("model_type") != "gpt_oss":
        raise CheckpointError(f"'{path}' is not a gpt-oss config (model_type={raw.get('model_type')!r})")
    for key in _REQUIRED_INTS:
        value = raw.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise CheckpointError(f"'{path}': {key} must be a positive integer, got {value!r}")
    if raw["num_attention_heads"] % raw["num_key_value_heads"]:
        raise CheckpointError(f"'{path}': num_attention_heads must be a multiple of num_key_value_heads")
    kwargs = {k: v for k, v in raw.items() if k not in ("quantization_config", "architectures", "transformers_version")}
    try:
        return GptOssConfig(**kwargs)
    except (TypeError, ValueError, KeyError) as e:
        raise CheckpointError(f"'{path}' is not a valid gpt-oss config: {str(e).splitlines()[0]}") from None


def build_skeleton(config: GptOssConfig) -> GptOssForCausalLM:
    """The model on the meta device: every parameter has its shape and dtype, none has storage."""
    with torch.device("meta"):
        return GptOssForCausalLM(config)


def expected_shapes(model: torch.nn.Module) -> dict[str, Shape]:
    return {name: tuple(p.shape) for name, p in model.named_parameters()}


def mxfp4_shapes(param_shape: Shape) -> tuple[Shape, Shape] | None:
    """``(blocks, scales)`` shapes storing an expert matrix ``[E, In, Out]`` as MXFP4 (module docstring), or None
    if ``In`` is not a whole number of blocks."""
    experts, fan_in, fan_out = param_shape
    if fan_in % MXFP4_BLOCK:
        return None
    groups = fan_in // MXFP4_BLOCK
    return (experts, fan_out, groups, MXFP4_BLOCK // 2), (experts, fan_out, groups)


def stored_tensors(folder: Path) -> tuple[dict[str, Shape | None], tuple[str, ...]]:
    """Tensor name → shape (None when only the index names it) and the index's absent shard files."""
    index_path = folder / INDEX
    stored: dict[str, Shape | None] = {}
    shards: list[str] = []
    if index_path.is_file():
        try:
            weight_map = json.loads(index_path.read_text())["weight_map"]
            if not isinstance(weight_map, dict):
                raise TypeError("weight_map is not an object")
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
            raise CheckpointError(f"'{index_path}' is not a safetensors index ({e})") from None
        stored = dict.fromkeys(weight_map)
        shards = sorted(set(weight_map.values()))
    elif (folder / SINGLE_FILE).is_file():
        shards = [SINGLE_FILE]
    absent = tuple(s for s in shards if not (folder / s).is_file())
    for shard in shards:
        if shard not in absent:
            stored.update(_header_shapes(folder / shard))
    return stored, absent


def _header_shapes(path: Path) -> dict[str, Shape | None]:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}  # noqa: SIM118
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"cannot read safetensors header of '{path}': {e}") from None


def compare(
    expected: dict[str, Shape], stored: dict[str, Shape | None], prefer_mxfp4: bool
) -> tuple[list[str], list[str], list[ShapeMismatch], list[str], int]:
    """``(missing, unexpected, mismatches, quantised, shapes_checked)``. An expert matrix matches either its plain
    name or the MXFP4 pair; when neither is there, the missing names follow ``prefer_mxfp4`` (the config's
    ``quantization_config``)."""
    missing: list[str] = []
    mismatches: list[ShapeMismatch] = []
    quantised: list[str] = []
    used: set[str] = set()
    checked = 0

    def check(name: str, want: Shape) -> None:
        nonlocal checked
        used.add(name)
        found = stored[name]
        if found is not None:
            checked += 1
            if found != want:
                mismatches.append(ShapeMismatch(name, want, found))

    for name, shape in expected.items():
        packed = mxfp4_shapes(shape) if name.endswith(_EXPERT_MATRICES) else None
        pair = (f"{name}_blocks", f"{name}_scales")
        if name in stored:
            check(name, shape)
        elif packed is not None and (prefer_mxfp4 or any(p in stored for p in pair)):
            quantised.append(name)
            for part, want in zip(pair, packed, strict=True):
                if part in stored:
                    check(part, want)
                else:
                    missing.append(part)
        else:
            missing.append(name)
    unexpected = sorted(set(stored) - used)
    return missing, unexpected, mismatches, quantised, checked


def check_checkpoint(folder: Path) -> CheckpointReport:
    """Build the skeleton from ``folder/config.json`` and compare it with the folder's index and shard headers."""
    folder = Path(folder)
    config = load_config(folder)
    raw = json.loads((folder / "config.json").read_text())
    quant = raw.get("quantization_config")
    prefer_mxfp4 = isinstance(quant, dict) and quant.get("quant_method") == "mxfp4"
    try:
        model = build_skeleton(config)
    except (TypeError, ValueError, RuntimeError) as e:
        raise CheckpointError(
            f"cannot build gpt-oss from '{folder / 'config.json'}': {str(e).splitlines()[0]}"
        ) from None
    expected = expected_shapes(model)
    stored, absent = stored_tensors(folder)
    missing, unexpected, mismatches, quantised, checked = (
        compare(expected, stored, prefer_mxfp4) if stored else ([], [], [], [], 0)
    )
    return CheckpointReport(
        folder=folder,
        config=config,
        num_parameters=sum(p.numel() for p in model.parameters()),
        tensors_named=len(stored),
        shapes_checked=checked,
        quantised=tuple(quantised),
        missing=tuple(missing),
        unexpected=tuple(unexpected),
        shape_mismatches=tuple(mismatches),
        absent_shards=absent,
    )


def first_problem(report: CheckpointReport) -> str | None:
    """Why the folder cannot be loaded as it is, in one line (the first problem found), or None if it can: every
    shard present, every parameter stored (plain, or as MXFP4 blocks with their scales) with the right shape, and
    nothing else."""
    if report.absent_shards:
        return f"shard file(s) named in {INDEX} are not in the folder: {', '.join(report.absent_shards)}"
    if report.tensors_named == 0:
        return f"no weights: neither {SINGLE_FILE} nor {INDEX} is in the folder"
    for name in report.quantised:  # half of an MXFP4 pair: the other half is missing, this one is not
        blocks, scales = f"{name}_blocks", f"{name}_scales"
        if (blocks in report.missing) != (scales in report.missing):
            have, lack = (scales, blocks) if blocks in report.missing else (blocks, scales)
            return f"MXFP4 tensor '{have}' has no '{lack}' beside it"
    if report.shape_mismatches:
        m = report.shape_mismatches[0]
        more = f" (and {len(report.shape_mismatches) - 1} more)" if len(report.shape_mismatches) > 1 else ""
        return f"'{m.name}' has shape {list(m.found)}, config.json implies {list(m.expected)}{more}"
    if report.missing:
        more = f" (and {len(report.missing) - 1} more)" if len(report.missing) > 1 else ""
        return f"tensor '{report.missing[0]}' is missing{more}"
    if report.unexpected:
        more = f" (and {len(report.unexpected) - 1} more)" if len(report.unexpected) > 1 else ""
        return f"tensor '{report.unexpected[0]}' is not a parameter of the model config.json describes{more}"
    return None
