"""Real gpt-oss checkpoints: the 20b skeleton builds on the meta device with the published parameter count, and
its names and shapes are checked against an index and shard headers, MXFP4 experts included."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

from harmonyrl.cli import app
from harmonyrl.errors import CheckpointError
from harmonyrl.models.real import (
    ShapeMismatch,
    build_skeleton,
    check_checkpoint,
    load_config,
    mxfp4_shapes,
)
from harmonyrl.models.synthetic import GPT_OSS_20B
from harmonyrl.models.tiny_gpt_oss import build_config, build_model, save_model

# Layer 0's tensors as openai/gpt-oss-20b's model.safetensors.index.json lists them (19 per layer; 24 × 19 + 3 =
# 459 tensors, the count llama.cpp's converter reports for this checkpoint). Experts are MXFP4 blocks + scales.
LAYER_0 = [
    f"model.layers.0.{suffix}"
    for suffix in (
        "input_layernorm.weight",
        "post_attention_layernorm.weight",
        "self_attn.q_proj.weight",
        "self_attn.q_proj.bias",
        "self_attn.k_proj.weight",
        "self_attn.k_proj.bias",
        "self_attn.v_proj.weight",
        "self_attn.v_proj.bias",
        "self_attn.o_proj.weight",
        "self_attn.o_proj.bias",
        "self_attn.sinks",
        "mlp.router.weight",
        "mlp.router.bias",
        "mlp.experts.gate_up_proj_blocks",
        "mlp.experts.gate_up_proj_scales",
        "mlp.experts.gate_up_proj_bias",
        "mlp.experts.down_proj_blocks",
        "mlp.experts.down_proj_scales",
        "mlp.experts.down_proj_bias",
    )
]
TOP = ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"]
SMALL_SHARD = "model-00002-of-00002.safetensors"


def _names() -> list[str]:
    return TOP + [n.replace(".0.", f".{i}.", 1) for i in range(24) for n in LAYER_0]


def _write_20b(folder: Path, names: list[str], small: dict[str, torch.Tensor] | None = None) -> Path:
    """config.json + an index of ``names``; ``small`` tensors go to one real shard, the rest to absent shards."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(GPT_OSS_20B))
    small = small or {}
    weight_map = {
        n: SMALL_SHARD if n in small else f"model-0000{i % 2}-of-00002.safetensors" for i, n in enumerate(names)
    }
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    if small:
        save_file(small, str(folder / SMALL_SHARD))
    return folder


def test_20b_skeleton_matches_its_real_tensor_names(tmp_path: Path) -> None:
    small = {
        "model.layers.0.self_attn.sinks": torch.zeros(64, dtype=torch.bfloat16),
        "model.layers.0.mlp.router.bias": torch.zeros(32, dtype=torch.bfloat16),
        "model.layers.3.mlp.experts.down_proj_bias": torch.zeros(32, 2880, dtype=torch.bfloat16),
    }
    report = check_checkpoint(_write_20b(tmp_path / "20b", _names(), small))
    assert len(_names()) == 459
    assert report.ok, (report.missing, report.unexpected, report.shape_mismatches)
    assert report.num_parameters == 20_914_757_184  # "21B parameters" in OpenAI's model card
    assert report.tensors_named == 459 and report.shapes_checked == 3
    assert len(report.quantised) == 48  # gate_up_proj and down_proj in each of 24 layers
    assert report.absent_shards == ("model-00000-of-00002.safetensors", "model-00001-of-00002.safetensors")


def test_renamed_tensor_is_missing_and_unexpected(tmp_path: Path) -> None:
    names = [
        n.replace("layers.7.mlp.experts.down_proj_scales", "layers.7.mlp.experts.down_proj_scale") for n in _names()
    ]
    report = check_checkpoint(_write_20b(tmp_path, names))
    assert report.missing == ("model.layers.7.mlp.experts.down_proj_scales",)
    assert report.unexpected == ("model.layers.7.mlp.experts.down_proj_scale",)
    assert not report.shape_mismatches and not report.ok


def test_wrong_shape_in_a_shard_header_is_reported(tmp_path: Path) -> None:
    small = {"model.layers.0.self_attn.sinks": torch.zeros(63), "model.norm.weight": torch.zeros(2880)}
    report = check_checkpoint(_write_20b(tmp_path, _names(), small))
    assert report.shape_mismatches == (ShapeMismatch("model.layers.0.self_attn.sinks", (64,), (63,)),)
    assert not report.missing and not report.unexpected and report.shapes_checked == 2


def test_mxfp4_shapes_of_the_20b_experts() -> None:
    # gate_up_proj_blocks of openai/gpt-oss-20b is uint8 [32, 5760, 90, 16] with scales [32, 5760, 90]
    assert mxfp4_shapes((32, 2880, 5760)) == ((32, 5760, 90, 16), (32, 5760, 90))
    assert mxfp4_shapes((32, 2880, 2880)) == ((32, 2880, 90, 16), (32, 2880, 90))
    assert mxfp4_shapes((4, 48, 96)) is None  # 48 inputs are not whole 32-value blocks


def test_building_the_20b_skeleton_allocates_no_weights(tmp_path: Path) -> None:
    config = load_config(_write_20b(tmp_path, []))
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # restart this process's peak-RSS counter (VmHWM)
    before = _status_kb("VmRSS")
    model = build_skeleton(config)
    grown_mib = (_status_kb("VmHWM") - before) / 1024
    assert all(p.is_meta for p in model.parameters())
    assert grown_mib < 256, grown_mib  # 20.9 B fp32 parameters would be 78 GiB


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith(field + ":")).split()[1])


def _nano_folder(folder: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    model = build_model(build_config("nano", 97, 0, 1), seed=0)
    save_model(model, folder)
    return folder, {k: v.clone() for k, v in model.state_dict().items()}


def test_tiny_checkpoint_with_real_shards_plain_and_mxfp4(tmp_path: Path) -> None:
    folder, state = _nano_folder(tmp_path / "plain")
    report = check_checkpoint(folder)
    assert report.ok and report.shapes_checked == len(state) and not report.quantised

    # the same model stored the way OpenAI ships experts: uint8 blocks + scales instead of the matrices
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4"}
    (folder / "config.json").write_text(json.dumps(config))
    packed: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        parts = mxfp4_shapes(tuple(tensor.shape)) if name.endswith(("gate_up_proj", "down_proj")) else None
        if parts is None:
            packed[name] = tensor
        else:
            packed[f"{name}_blocks"] = torch.zeros(parts[0], dtype=torch.uint8)
            packed[f"{name}_scales"] = torch.full(parts[1], 127, dtype=torch.uint8)
    save_file(packed, str(folder / "model.safetensors"))
    report = check_checkpoint(folder)
    assert report.ok and len(report.quantised) == 4 and report.shapes_checked == len(packed)

    packed["model.layers.1.mlp.experts.down_proj_scales"] = torch.zeros(4, 64, 3, dtype=torch.uint8)  # 2 blocks
    save_file(packed, str(folder / "model.safetensors"))
    report = check_checkpoint(folder)
    assert report.shape_mismatches == (
        ShapeMismatch("model.layers.1.mlp.experts.down_proj_scales", (4, 64, 2), (4, 64, 3)),
    )


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "has no config.json"),
        ("{not json", "is not valid JSON"),
        (json.dumps({"model_type": "llama"}), "is not a gpt-oss config"),
        (json.dumps({**GPT_OSS_20B, "hidden_size": "big"}), "hidden_size must be a positive integer"),
        (json.dumps({**GPT_OSS_20B, "num_key_value_heads": 7}), "multiple of num_key_value_heads"),
    ],
)
def test_bad_folders_are_one_line_errors(tmp_path: Path, content: str | None, message: str) -> None:
    if content is not None:
        (tmp_path / "config.json").write_text(content)
    with pytest.raises(CheckpointError, match=message):
        check_checkpoint(tmp_path)
    result = CliRunner().invoke(app, ["check-checkpoint", str(tmp_path)])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output


def test_cli_exit_codes(tmp_path: Path) -> None:
    runner = CliRunner()
    good = runner.invoke(app, ["check-checkpoint", str(_write_20b(tmp_path / "good", _names()))])
    assert good.exit_code == 0, good.output
    assert "20,914,757,184 parameters" in good.output and "459 tensors named" in good.output
    names = [n for n in _names() if n != "lm_head.weight"]
    bad = runner.invoke(app, ["check-checkpoint", str(_write_20b(tmp_path / "bad", names))])
    assert bad.exit_code == 1 and "✗ missing lm_head.weight" in bad.output


def test_unreadable_index_and_shard_are_one_line_errors(tmp_path: Path) -> None:
    folder = _write_20b(tmp_path / "index", [])
    (folder / "model.safetensors.index.json").write_text("[]")
    with pytest.raises(CheckpointError, match="is not a safetensors index"):
        check_checkpoint(folder)
    folder = _write_20b(tmp_path / "shard", ["model.norm.weight"], {"model.norm.weight": torch.zeros(2880)})
    (folder / SMALL_SHARD).write_bytes(b"\x07" * 40)
    with pytest.raises(CheckpointError, match="cannot read safetensors header"):
        check_checkpoint(folder)
    result = CliRunner().invoke(app, ["check-checkpoint", str(tmp_path / "absent")])
    assert result.exit_code == 2 and "is not a folder" in result.output
