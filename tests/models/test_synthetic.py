"""Synthetic checkpoints: a published geometry's names, shapes and layout, accepted and loaded like the real one."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from harmonyrl.models.load import load_checkpoint
from harmonyrl.models.real import check_checkpoint, first_problem
from harmonyrl.models.synthetic import GPT_OSS_20B, GPT_OSS_120B, scaled, write_synthetic

SMALL = {"hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 2, "num_local_experts": 4,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256}  # fmt: skip


def test_a_small_geometry_is_checked_and_loaded_like_the_published_layout(tmp_path: Path) -> None:
    config = scaled(GPT_OSS_20B, **SMALL)
    written = write_synthetic(tmp_path, config, shard_bytes=100_000)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert shards == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    assert index["metadata"]["total_size"] == written
    assert len(index["weight_map"]) == 2 * 19 + 3  # 19 tensors a layer (experts as blocks + scales), as 20b's index
    report = check_checkpoint(tmp_path)
    assert first_problem(report) is None and len(report.quantised) == 4
    model = load_checkpoint(tmp_path, dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    experts = model.model.layers[1].mlp.experts.gate_up_proj
    assert experts.shape == (4, 64, 128) and 0.01 < experts.float().std().item() < 0.05


def test_the_same_seed_writes_the_same_bytes(tmp_path: Path) -> None:
    config = scaled(GPT_OSS_20B, **SMALL)
    write_synthetic(tmp_path / "a", config, seed=3)
    write_synthetic(tmp_path / "b", config, seed=3)
    for name in ("model-00001-of-00001.safetensors", "config.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_published_geometries() -> None:
    assert GPT_OSS_120B["num_hidden_layers"] == 36 and len(GPT_OSS_120B["layer_types"]) == 36
    assert GPT_OSS_120B["num_local_experts"] == 128 and GPT_OSS_20B["num_local_experts"] == 32
    small = scaled(GPT_OSS_20B, num_hidden_layers=3, vocab_size=100)
    assert small["layer_types"] == ["sliding_attention", "full_attention", "sliding_attention"]
    assert (small["pad_token_id"], small["eos_token_id"]) == (99, 98)
