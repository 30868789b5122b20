"""What the embedded engine holds beyond the trainer's model (issue 38 item 2), and that holding less changes nothing.

* shared weights: the engine's parameters are the trainer's tensors (0 weight bytes of its own); a sync after an
  in-place update moves nothing and the engine samples the new weights; a sync never writes into a shared tensor;
  with LoRA it owns merged copies of the adapted tensors only; a replica (async pipeline) is always a copy.
* each expert once: a copying engine holds the model's bytes once, no re-laid-out expert copies.
* sliding-window KV: a sliding layer's cache holds its window, a full layer every position; a ring-buffered engine
  samples the same ids as one with full-length caches (log-probs within 1e-6 for eager torch, the same bits for the
  compiled step) for prompts longer than the window, through prefill, prefix-cache hits and decode.

Model: ``nano`` (window 32) and ``micro`` (window 64) presets, vocab 300, non-zero biases and sinks.
"""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import GptOssForCausalLM

from harmonyrl.engine.local import forward
from harmonyrl.engine.local.engine import LocalEngine
from harmonyrl.engine.local.kv_cache import KVCache
from harmonyrl.engine.local.native import KernelChoice
from harmonyrl.models.lora import add_lora, merged_model, merged_state_dict
from harmonyrl.models.tiny_gpt_oss import build_config, build_model
from harmonyrl.types import Generation, SamplingParams

VOCAB = 300
Turns = list[list[tuple[tuple[int, ...], tuple[float, ...]]]]


def model_for(preset: str = "nano", seed: int = 3) -> GptOssForCausalLM:
    model = build_model(build_config(preset, VOCAB, pad_token_id=0, eos_token_id=1), seed=seed).eval()  # type: ignore[arg-type]
    with torch.no_grad():  # non-zero biases and sinks, so a dropped term shows
        for name, p in model.named_parameters():
            if "bias" in name or "sinks" in name:
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(len(name)))
    return model


def ids(n: int, seed: int) -> list[int]:
    return torch.randint(2, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def model_bytes(model: torch.nn.Module) -> int:
    return sum(t.nbytes for t in (*model.parameters(), *model.buffers()))


def sample(engine: LocalEngine, prompt: list[int], seed: int = 1, n: int = 12) -> Generation:
    async def go() -> Generation:
        out = await engine.generate(prompt, SamplingParams(max_new_tokens=n, seed=seed))
        await engine.close()
        return out

    return asyncio.run(go())


def conversations(engine: LocalEngine, episodes: int = 6) -> Turns:
    """Three-turn episodes sharing a 90-token head (longer than either window), each turn re-sending the previous
    one plus a tool result: fresh prompts, a cached shared head, cached conversations, ragged prefills, decode
    past the window."""
    head = ids(90, 7)

    async def episode(seed: int) -> list[tuple[tuple[int, ...], tuple[float, ...]]]:
        prompt, out = head + ids(10 + seed * 7, seed), []
        for turn in range(3):
            g = await engine.generate(prompt, SamplingParams(max_new_tokens=20 + 9 * turn, seed=seed * 10 + turn))
            out.append((g.token_ids, g.logprobs))
            prompt = prompt + list(g.token_ids) + ids(5 + turn, 100 + seed)
        return out

    async def go() -> Turns:
        got = list(await asyncio.gather(*(episode(s) for s in range(episodes))))
        await engine.close()
        return got

    return asyncio.run(go())


@pytest.fixture(params=["native", "torch"])
def kernel(request: pytest.FixtureRequest) -> KernelChoice:
    return request.param  # type: ignore[no-any-return]


# ---------------------------------------------------------------- shared weights


def test_a_sharing_engine_uses_the_trainers_tensors_and_adds_no_weight_bytes() -> None:
    model = model_for()
    engine = LocalEngine(model, max_batch=4, max_seq_len=256, kernel="torch", share_weights=True)
    theirs = {n: p.data_ptr() for n, p in model.named_parameters()}
    assert {n: p.data_ptr() for n, p in engine._model.named_parameters()} == theirs
    mem = engine.memory(beside=model)
    assert mem.weights == 0 and mem.panels == 0
    assert mem.derived < 0.05 * model_bytes(model)  # q/k/v biases, RoPE tables: small
    copied = LocalEngine(model, max_batch=4, max_seq_len=256, kernel="torch").memory(beside=model)
    assert copied.weights == model_bytes(model)  # a copy holds every tensor once: no re-laid-out expert copies


def test_the_compiled_steps_panels_are_counted() -> None:
    """kernel=native packs every weight but the embedding (read in place) into panels: an honest second copy, even
    when the weights are shared."""
    model = model_for()
    mem = LocalEngine(model, max_batch=4, max_seq_len=256, kernel="native", share_weights=True).memory(beside=model)
    packed = model_bytes(model) - model.model.embed_tokens.weight.nbytes
    assert mem.weights == 0 and packed * 0.95 < mem.panels < packed * 1.3  # 16-column panels are zero-padded


def test_a_sync_after_an_in_place_update_moves_nothing_and_samples_the_new_weights(kernel: KernelChoice) -> None:
    model = model_for()
    engine = LocalEngine(model, max_batch=4, max_seq_len=256, kernel=kernel, share_weights=True)
    prompt = ids(50, 1)
    before = sample(engine, prompt)
    with torch.no_grad():  # what an optimizer step does: the trainer's tensors, in place
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.05)
    ptrs = [p.data_ptr() for p in engine._model.parameters()]
    asyncio.run(engine.sync_weights(model.state_dict(), 1))
    assert [p.data_ptr() for p in engine._model.parameters()] == ptrs and engine.policy_version == 1
    after = sample(engine, prompt)
    fresh = sample(LocalEngine(model, max_batch=4, max_seq_len=256, kernel=kernel), prompt)
    assert after.token_ids == fresh.token_ids and after.logprobs == fresh.logprobs
    assert after.logprobs != before.logprobs


def test_a_sharing_engine_never_writes_into_the_trainers_tensors() -> None:
    """A sync that hands other tensors (another model's) re-points the engine; the trainer's stay as they were."""
    model, other = model_for(seed=3), model_for(seed=9)
    kept = {n: p.detach().clone() for n, p in model.named_parameters()}
    engine = LocalEngine(model, max_batch=4, max_seq_len=256, kernel="torch", share_weights=True)
    engine.load_weights(other.state_dict())
    assert all(torch.equal(p, kept[n]) for n, p in model.named_parameters())
    prompt = ids(40, 2)
    want = sample(LocalEngine(other, max_batch=4, max_seq_len=256, kernel="torch"), prompt)
    assert sample(engine, prompt).logprobs == want.logprobs


def test_with_lora_the_engine_owns_merged_copies_of_the_adapted_tensors_only(kernel: KernelChoice) -> None:
    pytest.importorskip("peft")
    model = model_for()
    add_lora(model, r=4, alpha=8.0, dropout=0.0, targets=("q_proj", "v_proj"))
    engine = LocalEngine(model, max_batch=4, max_seq_len=256, kernel=kernel, share_weights=True)
    adapted = sum(p.nbytes for n, p in model.named_parameters() if n.endswith("base_layer.weight"))
    assert adapted > 0 and engine.memory(beside=model).weights == adapted
    with torch.no_grad():  # an adapter step: B leaves zero, so W + BA moves
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.2, generator=torch.Generator().manual_seed(len(n)))
    asyncio.run(engine.sync_weights(merged_state_dict(model), 1))
    assert engine.memory(beside=model).weights == adapted  # the new merged tensors replaced the old ones
    prompt = ids(45, 4)
    want = sample(LocalEngine(merged_model(model), max_batch=4, max_seq_len=256, kernel=kernel), prompt)
    got = sample(engine, prompt)
    assert got.token_ids == want.token_ids and got.logprobs == want.logprobs


def test_a_replica_is_always_a_copy() -> None:
    """The async pipeline samples old versions on replicas while the trainer updates: they must not share."""
    model = model_for()
    engine = LocalEngine(model, max_batch=4, max_seq_len=256, kernel="torch", share_weights=True)
    copy_ = engine.replica()
    assert not copy_.share_weights and copy_.memory(beside=model).weights == model_bytes(model)


def test_bf16_engine_shares_a_bf16_model_and_copies_an_fp32_one() -> None:
    model = model_for()
    engine = LocalEngine(model, max_batch=2, max_seq_len=128, kernel="torch", dtype=torch.bfloat16, share_weights=True)
    assert all(p.dtype == torch.bfloat16 for p in engine._model.parameters())
    assert engine.memory(beside=model).weights == model_bytes(model) // 2  # another dtype: a cast copy
    half = model_for().to(torch.bfloat16)
    shared = LocalEngine(half, max_batch=2, max_seq_len=128, kernel="torch", dtype=torch.bfloat16, share_weights=True)
    assert shared.memory(beside=half).weights == 0
    prompt = ids(40, 5)
    assert sample(shared, prompt).logprobs == sample(engine, prompt).logprobs  # the same bf16 weights either way


# ---------------------------------------------------------------- sliding-window KV


def test_a_sliding_layers_cache_holds_its_window_and_a_full_layers_every_position() -> None:
    model = model_for("micro")
    engine = LocalEngine(model, max_batch=4, max_seq_len=512, kernel="torch")
    cache, kinds = engine._fwd.cache, model.config.layer_types
    assert kinds is not None and "sliding_attention" in kinds and "full_attention" in kinds
    for k, kind in zip(cache.k, kinds, strict=True):
        assert k.shape == (4, model.config.num_key_value_heads, 64 if kind == "sliding_attention" else 512, 32)
    full_length = 2 * 4 * len(kinds) * model.config.num_key_value_heads * 512 * 32 * 4
    assert cache.nbytes == full_length // 2 + full_length // 2 * 64 // 512


class _FullLength(KVCache):
    """Today's layout before the ring: every layer keeps every position (the reference)."""

    def __init__(self, sliding: list[bool], slots: int, kv_heads: int, max_seq_len: int, *rest: object) -> None:
        head_dim, _, dtype, device = rest
        super().__init__(sliding, slots, kv_heads, max_seq_len, head_dim, max_seq_len, dtype, device)  # type: ignore[arg-type]


@pytest.mark.parametrize("preset", ["nano", "micro"])
def test_ring_buffered_sliding_layers_sample_what_full_length_caches_do(
    preset: str, kernel: KernelChoice, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = model_for(preset)
    ring = conversations(LocalEngine(model, max_batch=4, max_seq_len=400, kernel=kernel))
    monkeypatch.setattr(forward, "KVCache", _FullLength)
    reference = LocalEngine(model, max_batch=4, max_seq_len=400, kernel=kernel)
    assert not any(reference._fwd.cache.ring(i) for i in range(len(reference._fwd.cache.caps)))
    full = conversations(reference)
    assert reference.stats.prefix_tokens_reused > 0  # the prefix cache served heads and conversations
    for got, want in zip(ring, full, strict=True):
        for (got_ids, got_lp), (want_ids, want_lp) in zip(got, want, strict=True):
            assert got_ids == want_ids
            if kernel == "native":  # the C step reads the ring in position order: the same sums
                assert got_lp == want_lp
            else:  # eager torch attends over the ring in ring order: fp32 rounding only
                torch.testing.assert_close(torch.tensor(got_lp), torch.tensor(want_lp), atol=1e-6, rtol=0)
