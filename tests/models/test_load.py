"""Loading gpt-oss checkpoints in every layout a real one comes in (tiny ones, written by ``ckpt_writers``): the
weights land in fp32 equal to what the file holds, the logits follow, and a folder that cannot load is a one-line
error naming the cause."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from ckpt_writers import (
    EXPERT_MATRICES,
    QUANTIZATION_CONFIG,
    mxfp4_encode,
    mxfp4_state,
    write_bf16_sharded,
    write_mxfp4,
    write_original,
    write_sharded,
)
from transformers import AutoModelForCausalLM, GptOssForCausalLM
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

from harmonyrl.errors import CheckpointError
from harmonyrl.models.load import load_checkpoint
from harmonyrl.models.tiny_gpt_oss import build_config, build_model, load_model, save_model

VOCAB = 97
Edit = Callable[[Path, GptOssForCausalLM], None]
"""Spoils a written checkpoint folder."""


@pytest.fixture(scope="module")
def source() -> GptOssForCausalLM:
    return build_model(build_config("nano", VOCAB, 0, 1), seed=0)


@pytest.fixture(scope="module")
def ids() -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, 40), generator=torch.Generator().manual_seed(0))


def _logits(model: GptOssForCausalLM, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


def _rounded(model: GptOssForCausalLM, experts_mxfp4: bool, others_bf16: bool) -> GptOssForCausalLM:
    """The source with each weight replaced by what the checkpoint stores, decoded in fp32 (the expected load)."""
    out = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in out.named_parameters():
            if name.endswith(EXPERT_MATRICES) and experts_mxfp4:
                p.copy_(convert_moe_packed_tensors(*mxfp4_encode(p.data), dtype=torch.float32))
            elif others_bf16:  # every tensor not stored as MXFP4
                p.copy_(p.to(torch.bfloat16).float())
    return out


def _assert_same_weights(loaded: GptOssForCausalLM, expected: GptOssForCausalLM) -> None:
    want = dict(expected.named_parameters())
    got = dict(loaded.named_parameters())
    assert got.keys() == want.keys()
    for name, p in got.items():
        assert p.dtype == torch.float32, name
        assert torch.equal(p, want[name]), name


@pytest.mark.parametrize("with_quantization_config", [True, False])
def test_mxfp4_checkpoint_loads_dequantised(
    tmp_path: Path, source: GptOssForCausalLM, ids: torch.Tensor, with_quantization_config: bool
) -> None:
    """openai/gpt-oss-20b's layout: bf16 tensors, experts as blocks + scales, two shards and an index. Without
    ``quantization_config`` the blocks are recognised by name (transformers alone would init the experts at
    random)."""
    folder = write_mxfp4(source, tmp_path / "mx", quantization_config=with_quantization_config)
    assert len(list(folder.glob("model-*.safetensors"))) == 2
    loaded = load_checkpoint(folder)
    expected = _rounded(source, experts_mxfp4=True, others_bf16=True)
    _assert_same_weights(loaded, expected)
    assert torch.equal(_logits(loaded, ids), _logits(expected, ids))
    # against the unquantised source: 4-bit experts move the logits, measured max |Δ| 0.169 (logits up to 0.62)
    diff = (_logits(loaded, ids) - _logits(source, ids)).abs().max().item()
    assert 0.01 < diff < 0.3, diff
    assert "quantization_config" not in loaded.config.to_dict()  # a save writes the plain layout, as it holds


def test_bf16_sharded_checkpoint_loads_to_fp32(tmp_path: Path, source: GptOssForCausalLM, ids: torch.Tensor) -> None:
    folder = write_bf16_sharded(source, tmp_path / "bf16")
    assert (folder / "model.safetensors.index.json").is_file() and len(list(folder.glob("*.safetensors"))) >= 3
    loaded = load_checkpoint(folder)
    expected = _rounded(source, experts_mxfp4=False, others_bf16=True)
    for name, p in source.named_parameters():
        # bf16 keeps 8 significant bits: with 2**e <= |w|, one ulp is 2**(e-7) and round to nearest errs by at
        # most half of it, 2**(e-8) <= |w| · 2**-8
        assert torch.all((expected.get_parameter(name) - p).abs() <= p.abs() * 2**-8), name
    _assert_same_weights(loaded, expected)
    assert torch.equal(_logits(loaded, ids), _logits(expected, ids))


def test_plain_weights_under_an_mxfp4_config_load(tmp_path: Path, source: GptOssForCausalLM) -> None:
    """A dequantised copy saved with the quantised model's config.json: the tensors decide, not the config."""
    folder = write_bf16_sharded(source, tmp_path / "plain")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "quantization_config": QUANTIZATION_CONFIG}))
    _assert_same_weights(load_checkpoint(folder), _rounded(source, experts_mxfp4=False, others_bf16=True))


def test_original_layout_loads(tmp_path: Path, source: GptOssForCausalLM, ids: torch.Tensor) -> None:
    """OpenAI's ``original/`` names (qkv fused, ``mlp1_weight.blocks``, ``norm.scale``) map onto every parameter;
    the other tensors are stored in fp32 here, so they come back exactly."""
    loaded = load_checkpoint(write_original(source, tmp_path / "original"))
    expected = _rounded(source, experts_mxfp4=True, others_bf16=False)
    _assert_same_weights(loaded, expected)
    assert loaded.config.rope_parameters["rope_type"] == "yarn" and loaded.config.rope_parameters["factor"] == 1.0
    assert torch.equal(_logits(loaded, ids), _logits(expected, ids))


def test_own_checkpoint_loads_exactly_and_with_transformers(tmp_path: Path, source: GptOssForCausalLM) -> None:
    save_model(source, tmp_path / "own")
    _assert_same_weights(load_model(tmp_path / "own"), source)
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "own")
    assert torch.equal(
        plain.get_parameter("model.layers.1.mlp.experts.down_proj"), source.model.layers[1].mlp.experts.down_proj
    )


def _mxfp4_folder(tmp_path: Path, source: GptOssForCausalLM) -> Path:
    return write_mxfp4(source, tmp_path / "bad")


def _without(name: str) -> Edit:
    def edit(folder: Path, source: GptOssForCausalLM) -> None:
        state = mxfp4_state(source)
        del state[name]
        for f in folder.glob("model-*.safetensors"):
            f.unlink()
        write_sharded(state, folder)

    return edit


def _model_type_llama(folder: Path, source: GptOssForCausalLM) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "llama"}))


def _shard_gone(folder: Path, source: GptOssForCausalLM) -> None:
    (folder / "model-00002-of-00002.safetensors").unlink()


def _wrong_shape(folder: Path, source: GptOssForCausalLM) -> None:
    state = mxfp4_state(source)
    state["model.layers.0.mlp.router.bias"] = torch.zeros(5)
    write_sharded(state, folder)


def _no_weights(folder: Path, source: GptOssForCausalLM) -> None:
    for f in folder.glob("model*.safetensors*"):
        f.unlink()


def _garbage_tensor_data(folder: Path, source: GptOssForCausalLM) -> None:
    shard = folder / "model-00001-of-00002.safetensors"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])  # the header is whole, the tensors are cut short


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_model_type_llama, "is not a gpt-oss config (model_type='llama')"),
        (_shard_gone, "are not in the folder: model-00002-of-00002.safetensors"),
        (
            _without("model.layers.1.mlp.experts.down_proj_scales"),
            "MXFP4 tensor 'model.layers.1.mlp.experts.down_proj_blocks' has no "
            "'model.layers.1.mlp.experts.down_proj_scales' beside it",
        ),
        (_without("model.layers.0.self_attn.sinks"), "tensor 'model.layers.0.self_attn.sinks' is missing"),
        (_wrong_shape, "'model.layers.0.mlp.router.bias' has shape [5], config.json implies [4]"),
        (_no_weights, "no weights: neither model.safetensors nor model.safetensors.index.json"),
        (_garbage_tensor_data, "cannot read safetensors header"),
    ],
)
def test_bad_checkpoints_are_one_line_errors(
    tmp_path: Path, source: GptOssForCausalLM, edit: Edit, message: str
) -> None:
    folder = _mxfp4_folder(tmp_path, source)
    edit(folder, source)
    with pytest.raises(CheckpointError) as info:
        load_model(folder)
    text = str(info.value)
    assert text.startswith(f"cannot load checkpoint '{folder}': ") and message in text, text
    assert "\n" not in text


def test_folder_without_config_is_a_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"no config\.json inside"):
        load_model(tmp_path)


def _original_without_scales(folder: Path) -> None:
    from safetensors.torch import load_file, save_file

    state = load_file(str(folder / "model.safetensors"))
    del state["block.1.mlp.mlp2_weight.scales"]
    save_file(state, str(folder / "model.safetensors"))


def _original_unknown_tensor(folder: Path) -> None:
    from safetensors.torch import load_file, save_file

    state = load_file(str(folder / "model.safetensors"))
    state["block.0.attn.rotary"] = torch.zeros(2)
    save_file(state, str(folder / "model.safetensors"))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            _original_without_scales,
            "MXFP4 tensor 'block.1.mlp.mlp2_weight.blocks' has no 'block.1.mlp.mlp2_weight.scales' beside it",
        ),
        (_original_unknown_tensor, "tensor 'block.0.attn.rotary' is not part of the original gpt-oss layout"),
        (lambda f: (f / "model.safetensors").unlink(), "no *.safetensors file beside the original config.json"),
    ],
)
def test_bad_original_checkpoints_are_one_line_errors(
    tmp_path: Path, source: GptOssForCausalLM, edit: Callable[[Path], None], message: str
) -> None:
    folder = write_original(source, tmp_path / "original")
    edit(folder)
    with pytest.raises(CheckpointError) as info:
        load_model(folder)
    assert message in str(info.value) and "\n" not in str(info.value), str(info.value)
