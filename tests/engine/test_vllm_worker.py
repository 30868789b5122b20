"""The server half of the weight sync (harmonyrl.engine.vllm_worker) without vLLM: how the experts are handed to
vLLM's reload, how the sinks are copied, that what vLLM reports as not loaded fails the sync, and the launcher's
refusal of a venv built by an older scripts/vllm_env.sh. The real server: tests/engine/test_vllm_server.py."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from harmonyrl.engine import vllm_launch, vllm_worker
from harmonyrl.engine.vllm_worker import SYNC_PROTOCOL, WeightSync, copy_sinks, heads_of_rank, stream_experts
from harmonyrl.errors import EngineUnavailable


def test_fused_experts_are_handed_over_one_expert_at_a_time() -> None:
    gate_up = torch.arange(2 * 3 * 4.0).reshape(2, 3, 4)  # [E=2, H=3, 2I=4], checkpoint layout
    bias = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    weights = [
        ("model.layers.1.mlp.experts.gate_up_proj", gate_up),
        ("model.layers.1.mlp.experts.down_proj_bias", bias),
        ("model.layers.1.mlp.router.weight", torch.ones(2, 3)),
    ]
    out = list(stream_experts(weights))
    assert [n for n, _ in out] == [
        "model.layers.1.mlp.experts.0.gate_up_proj",
        "model.layers.1.mlp.experts.1.gate_up_proj",
        "model.layers.1.mlp.experts.0.down_proj_bias",
        "model.layers.1.mlp.experts.1.down_proj_bias",
        "model.layers.1.mlp.router.weight",
    ]
    assert torch.equal(out[1][1], gate_up[1]) and out[3][1].tolist() == [3.0, 4.0]  # untransposed: vLLM transposes


def test_sinks_are_split_by_tensor_parallel_rank() -> None:
    sinks = torch.tensor([0.0, 1.0, 2.0, 3.0])
    assert heads_of_rank(sinks, rank=1, world=2).tolist() == [2.0, 3.0]
    assert heads_of_rank(sinks, rank=0, world=1).tolist() == [0.0, 1.0, 2.0, 3.0]
    with pytest.raises(ValueError, match="do not split over 3"):
        heads_of_rank(sinks, rank=0, world=3)


class Impl:
    def __init__(self, sinks: torch.Tensor) -> None:
        self.sinks = sinks


class Attention(torch.nn.Module):
    """vLLM's OAIAttention in miniature: ``sinks`` and an attention kernel that holds them."""

    def __init__(self, kernel_copy: bool) -> None:
        super().__init__()
        self.sinks = torch.nn.Parameter(torch.zeros(2), requires_grad=False)
        self.attn = torch.nn.Module()
        self.attn.impl = Impl(self.sinks.to(torch.bfloat16) if kernel_copy else self.sinks)  # type: ignore[assignment]


class CPUUnquantizedExperts:
    """vLLM's CPU MoE kernel: prepacks the layer's weights (here: records that it did)."""

    def __init__(self) -> None:
        self.prepacked: list[torch.nn.Module] = []

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        self.prepacked.append(layer)


class X86CPUUnquantizedExperts(CPUUnquantizedExperts):
    pass


class GptOssRoutedExperts(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w13_weight = torch.nn.Parameter(torch.zeros(3, 4, 2), requires_grad=False)
        self.quant_method = SimpleNamespace(moe_kernel=SimpleNamespace(fused_experts=X86CPUUnquantizedExperts()))


class YaRNScalingRotaryEmbedding(torch.nn.Module):
    """No parameters, a computed buffer: vLLM's reload reports it as failed at every reload."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("cos_sin_cache", torch.zeros(4), persistent=False)


def served_model(kernel_copy: bool = False) -> torch.nn.Module:
    """``layers.<i>.attn.sinks``, as vLLM names them (the checkpoint: ``layers.<i>.self_attn.sinks``)."""
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList([torch.nn.Module(), torch.nn.Module()])
    for block in model.layers:
        block.attn = Attention(kernel_copy)
        block.rotary = YaRNScalingRotaryEmbedding()
        block.experts = GptOssRoutedExperts()
    return model


def test_sinks_are_copied_in_place_into_the_parameter_and_the_kernels_own_copy() -> None:
    model = served_model(kernel_copy=True)
    live = [block.attn.sinks for block in model.layers]
    tensors = {f"layers.{i}.self_attn.sinks": torch.tensor([1.5, -2.0 - i, 7.0, 8.0]) for i in range(2)}
    assert copy_sinks(model, tensors, rank=0, world=2) == 2
    assert [block.attn.sinks for block in model.layers] == live  # same tensors: the kernel's references stay valid
    assert model.layers[1].attn.sinks.tolist() == [1.5, -3.0]
    assert model.layers[1].attn.attn.impl.sinks.float().tolist() == [1.5, -3.0]
    with pytest.raises(KeyError, match=r"no layers.1.self_attn.sinks"):
        copy_sinks(model, {"layers.0.self_attn.sinks": torch.zeros(2)}, rank=0, world=1)


class FakeWorker(WeightSync):
    """vLLM's worker as the extension sees it: ``reload_weights`` logs what vLLM 0.32 logs."""

    def __init__(self, failing: list[str]) -> None:
        self.model = served_model()
        self.failing, self.reloaded = failing, dict[str, torch.Tensor]()
        self.model_runner = self

    def get_model(self) -> torch.nn.Module:
        return self.model

    def reload_weights(self, weights_iterator: Iterable[tuple[str, torch.Tensor]], is_checkpoint_format: bool) -> None:
        assert is_checkpoint_format
        self.reloaded = dict(weights_iterator)
        for layer in self.failing:
            logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").warning(
                "%s: Failed to load weights", layer
            )


def weights_folder(tmp_path: Path) -> Path:
    tensors = {f"layers.{i}.self_attn.sinks": torch.tensor([0.5, 0.25]) for i in range(2)}
    tensors["layers.0.mlp.experts.down_proj"] = torch.ones(3, 2, 2)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    return tmp_path


def test_a_sync_reloads_streamed_experts_then_the_sinks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_worker, "tensor_parallel", lambda: (0, 1))
    # what vLLM 0.32 reports at every reload: the sinks' owner (we load the sinks) and the rotary embedding (computed)
    worker = FakeWorker(failing=["Attention", "YaRNScalingRotaryEmbedding"])
    report = worker.harmonyrl_load_weights(str(weights_folder(tmp_path)))
    assert report == {"protocol": SYNC_PROTOCOL, "tensors": 3, "sinks": 2}
    assert "layers.0.mlp.experts.2.down_proj" in worker.reloaded
    assert worker.model.layers[0].attn.sinks.tolist() == [0.5, 0.25]
    # the CPU kernel's prepack, which vLLM's reload skips, ran once on each MoE layer
    for block in worker.model.layers:
        assert block.experts.quant_method.moe_kernel.fused_experts.prepacked == [block.experts]


def test_a_layer_vllm_did_not_reload_fails_the_sync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What vLLM 0.32 does with fused experts: it logs the layer as not loaded and keeps the old tensors."""
    monkeypatch.setattr(vllm_worker, "tensor_parallel", lambda: (0, 1))
    worker = FakeWorker(failing=["Attention", "GptOssRoutedExperts"])
    report = worker.harmonyrl_load_weights(str(weights_folder(tmp_path)))
    assert report == {
        "protocol": SYNC_PROTOCOL,
        "error": "RuntimeError: vLLM did not reload layers.0.experts.w13_weight, layers.1.experts.w13_weight",
    }
    (tmp_path / "model.safetensors").unlink()
    assert "No such file" in str(FakeWorker(failing=[]).harmonyrl_load_weights(str(tmp_path))["error"])


def test_a_venv_from_an_older_vllm_env_script_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").write_text("")
    monkeypatch.setenv("HARMONYRL_VLLM_VENV", str(tmp_path))
    with pytest.raises(EngineUnavailable) as info:
        vllm_launch.venv_python()
    assert "built by an older scripts/vllm_env.sh (format 1, need 2" in str(info.value)
    assert "rerun scripts/vllm_env.sh" in str(info.value) and "\n" not in str(info.value)
    (tmp_path / vllm_launch.VENV_STAMP).write_text("2\n")
    assert vllm_launch.venv_python() == tmp_path / "bin" / "python"


def test_the_server_loads_the_extension_from_this_package(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(
        '{"rope_parameters": {"rope_theta": 10000.0}, "max_position_embeddings": 256}', encoding="utf-8"
    )
    command = vllm_launch.server_command(Path("python"), tmp_path, "tiny", 8000, 256)
    assert command[command.index("--worker-extension-cls") + 1] == "harmonyrl.engine.vllm_worker.WeightSync"
    folder = vllm_launch.package_path(tmp_path)
    assert (folder / "harmonyrl" / "engine" / "vllm_worker.py").samefile(vllm_worker.__file__)
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "harmonyrl"]
