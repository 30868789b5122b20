"""What a vLLM weight sync sends: only the layers that trained (LoRA: the adapted ones, merged; whole vLLM layers,
q/k/v together, biases along), in bf16, through a memory-backed file; the bytes it moves before and after."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import load_file
from transformers import GptOssForCausalLM

from harmonyrl.engine.config import VllmEngineConfig
from harmonyrl.engine.vllm import VllmEngine
from harmonyrl.engine.vllm_worker import SYNC_PROTOCOL
from harmonyrl.engine.weight_sync import UPDATE_FILE, memory_dir, nbytes, selected, sync_tensors, vllm_layer
from harmonyrl.harmony.tokenizer import HarmonyTokenizer
from harmonyrl.models.lora import adapted_names, add_lora, merged_state_dict
from harmonyrl.models.tiny_gpt_oss import build_config, build_model

TOK = HarmonyTokenizer.load_default()
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")


def tiny() -> GptOssForCausalLM:
    """The micro model the ``-m vllm`` tests serve."""
    config = build_config("micro", TOK.vocab_size, TOK.special.endoftext, TOK.special.return_, max_positions=256)
    return build_model(config, seed=0).eval()


def test_vllm_layers_fuse_q_k_v_and_keep_biases_with_their_weights() -> None:
    assert vllm_layer("model.layers.0.self_attn.k_proj.bias") == "model.layers.0.self_attn.qkv_proj"
    assert vllm_layer("model.layers.0.self_attn.o_proj.weight") == "model.layers.0.self_attn.o_proj"
    assert vllm_layer("model.layers.1.mlp.experts.down_proj_bias") == "model.layers.1.mlp.experts"
    names = [f"l.self_attn.{p}.{t}" for p in ATTENTION for t in ("weight", "bias")] + ["l.self_attn.sinks"]
    # q alone trained: k and v come along (one qkv_proj in vLLM), and every bias; o_proj and the sinks do not
    assert selected(names, {"l.self_attn.q_proj.weight"}) == names[:6]
    assert selected(names, None) == names  # full fine-tuning: everything
    with pytest.raises(KeyError, match="not in the state dict"):
        selected(names, {"l.self_attn.x.weight"})


def test_a_lora_sync_sends_only_the_merged_attention_layers_in_bf16() -> None:
    model = tiny()
    before = nbytes(model.state_dict())  # every tensor in fp32: what each sync moved before
    add_lora(model, r=4, alpha=8, dropout=0.0, targets=ATTENTION)
    trained = adapted_names(model)
    assert trained and all(n.endswith(tuple(f"self_attn.{p}.weight" for p in ATTENTION)) for n in trained)
    with torch.no_grad():  # a trained adapter: B no longer zero
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.add_(0.01)
    merged = merged_state_dict(model)
    sent = sync_tensors(merged, trained, torch.bfloat16)
    assert set(sent) == {n for n in merged if ".self_attn." in n and n.rsplit(".", 2)[-2] in ATTENTION}
    assert all(t.dtype == torch.bfloat16 for t in sent.values())
    for name, t in sent.items():  # the merged weights W + (alpha/r)·BA, rounded once to bf16
        assert torch.equal(t, merged[name].to(torch.bfloat16))
    after = nbytes(sent)
    assert after == sum(merged[n].numel() * 2 for n in sent)
    print(f"sync bytes, micro model, LoRA on q/k/v/o: before {before} (fp32, every tensor), after {after} (bf16)")
    assert after < before / 10


def test_adapted_names_is_empty_without_lora_and_full_fine_tuning_sends_everything() -> None:
    model = tiny()
    assert adapted_names(model) == frozenset()
    state = model.state_dict()
    sent = sync_tensors(state, None, torch.bfloat16)
    assert list(sent) == list(state) and nbytes(sent) * 2 == nbytes(state)


def test_the_update_goes_to_shared_memory_by_default(tmp_path: Path) -> None:
    folder = memory_dir(tmp_path)
    assert folder.parent == Path("/dev/shm") if Path("/dev/shm").is_dir() else folder == tmp_path
    assert memory_dir(tmp_path) == folder  # the same run's syncs reuse one folder


def test_the_client_sends_the_base_once_then_partial_updates_and_reloads_both(tmp_path: Path) -> None:
    rpcs: list[dict[str, object]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/collective_rpc":
            rpcs.append(json.loads(request.content)["kwargs"])
            return httpx.Response(200, json={"results": [{"protocol": SYNC_PROTOCOL, "tensors": 1, "sinks": 0}]})
        return httpx.Response(200, json={})

    config = VllmEngineConfig(url="http://127.0.0.1:1", model="m", update_dir=str(tmp_path / "shm"))
    trained = frozenset({"a.q_proj.weight"})
    client = VllmEngine(config, 100, 64, tmp_path / "sync", transport=httpx.MockTransport(handler), trained=trained)
    state = {"a.q_proj.weight": torch.ones(2, 2), "a.k_proj.weight": torch.ones(2), "b.w": torch.ones(8)}

    async def run() -> None:
        await client.sync_weights(state, 0)
        assert client.last_sync_bytes == 14 * 2  # every tensor, bf16
        await client.sync_weights({k: v * 2 for k, v in state.items()}, 1)
        await client._reload(client.reloads)  # a restarted server: the base, then the last update
        await client.close()

    asyncio.run(run())
    update = tmp_path / "shm" / UPDATE_FILE
    assert rpcs == [
        {"weights_path": str(tmp_path / "sync")},
        {"weights_path": str(update), "partial": True},
        {"weights_path": str(tmp_path / "sync")},
        {"weights_path": str(update), "partial": True},
    ]
    sent = load_file(str(update))
    assert set(sent) == {"a.q_proj.weight", "a.k_proj.weight"} and sent["a.q_proj.weight"].dtype == torch.bfloat16
    assert client.last_sync_bytes == 6 * 2 and client.sync_bytes == 20 * 2
    assert load_file(str(tmp_path / "sync" / "model.safetensors"))["b.w"].dtype == torch.bfloat16
