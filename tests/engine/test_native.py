"""The compiled decode step (``engine/native.py``, ``engine/csrc``) against the eager torch decode step it replaces.

Both run the same cache and weights: logits within 1e-5, the keys/values each writes within 1e-6 (+ 1e-5
relative), the same experts chosen. Shapes cover both builds of the math (AVX2 and portable), ragged
positions past the sliding window, non-contiguous slots, every head_dim the step admits, biases off, sinks
off, and a weight sync. A missing build fails here (CI compiles it): it is not skipped.
"""

from __future__ import annotations

import asyncio
import ctypes

import pytest
import torch
from transformers import GptOssConfig, GptOssForCausalLM

from harmonyrl.engine.local.engine import LocalEngine
from harmonyrl.engine.local.forward import LeanForward
from harmonyrl.engine.local.native import NativeDecode, isa, library, native_unsupported, pack
from harmonyrl.errors import KernelUnavailable
from harmonyrl.models.tiny_gpt_oss import build_config, build_model
from harmonyrl.types import SamplingParams

VOCAB = 300


def model_with(preset: str = "nano", seed: int = 0, **overrides: object) -> GptOssForCausalLM:
    config = build_config(preset, VOCAB, pad_token_id=0, eos_token_id=1)  # type: ignore[arg-type]
    for key, value in overrides.items():
        setattr(config, key, value)
    model = build_model(config, seed=seed).eval()
    with torch.no_grad():  # non-zero biases and sinks, so a dropped term shows
        for name, p in model.named_parameters():
            if "bias" in name or "sinks" in name:
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(len(name)))
    return model


def filled(model: GptOssForCausalLM, slots: int, lengths: list[int], sinks: bool = True) -> LeanForward:
    """A LeanForward whose slots ``0..len(lengths)-1`` hold prefilled random prompts of those lengths."""
    fwd = LeanForward(model, slots, 160, sinks=sinks)
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(2, VOCAB, (len(lengths), max(lengths)), generator=gen)
    with torch.inference_mode():
        fwd.prefill(tokens, torch.tensor(lengths), torch.arange(len(lengths)))
    return fwd


def both_steps(
    fwd: LeanForward, tokens: list[int], positions: list[int], slots: list[int]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(torch logits, native logits, torch keys, native keys, torch values, native values) of one decode step
    from the same cache; the native step also returns the experts it chose (checked by the caller)."""
    saved = fwd.cache.state()
    with torch.inference_mode():
        ref = fwd.decode(torch.tensor(tokens), positions, slots)
        k_ref, v_ref = torch.cat([t.flatten() for t in fwd.cache.k]), torch.cat([t.flatten() for t in fwd.cache.v])
        fwd.cache.restore(saved)
        out, _ = NativeDecode(fwd)(torch.tensor(tokens), torch.tensor(positions), torch.tensor(slots), record=False)
    k, v = torch.cat([t.flatten() for t in fwd.cache.k]), torch.cat([t.flatten() for t in fwd.cache.v])
    return ref, out, k_ref, k, v_ref, v


@pytest.fixture(params=["avx2", "generic"])
def build(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the test on each build of the math this machine can run (the portable one everywhere)."""
    if request.param == "generic":
        monkeypatch.setenv("HARMONYRL_NATIVE_ISA", "generic")
    elif isa() != "avx2":
        pytest.skip("this CPU has no AVX2 + FMA: only the portable build runs here")
    assert isa() == request.param
    return request.param  # type: ignore[no-any-return]


def test_extension_is_built_and_auto_picks_it() -> None:
    assert library() is not None, "harmonyrl.engine.local._decode was not compiled: pip install should build it"
    model = model_with()
    assert LocalEngine(model, max_batch=2, max_seq_len=64).kernel == "native"
    assert LocalEngine(model, max_batch=2, max_seq_len=64, kernel="torch").kernel == "torch"


@pytest.mark.parametrize("preset", ["nano", "micro"])
def test_decode_matches_the_torch_step(build: str, preset: str) -> None:
    """Ragged positions, two rows past the 32/64-token window, slots out of order with a gap."""
    model = model_with(preset)
    fwd = filled(model, 8, [5, 40, 70, 12, 100, 1])
    tokens, positions, slots = [3, 4, 5, 6, 7], [40, 70, 12, 100, 5], [1, 2, 3, 4, 0]
    ref, out, k_ref, k, v_ref, v = both_steps(fwd, tokens, positions, slots)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.log_softmax(out, -1), torch.log_softmax(ref, -1), atol=1e-5, rtol=0)
    torch.testing.assert_close(k, k_ref, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(v, v_ref, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("head_dim", [8, 64])
def test_decode_matches_for_every_admitted_head_dim(build: str, head_dim: int) -> None:
    model = model_with(head_dim=head_dim)
    fwd = filled(model, 4, [33, 9, 50])
    ref, out, *_ = both_steps(fwd, [10, 11, 12], [33, 9, 50], [0, 1, 2])
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)


def test_decode_without_biases_or_sinks_matches(build: str) -> None:
    model = model_with(attention_bias=False)
    assert model.model.layers[0].self_attn.q_proj.bias is None
    fwd = filled(model, 4, [20, 45], sinks=False)
    ref, out, *_ = both_steps(fwd, [8, 9], [20, 45], [0, 1])
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)


def test_routing_is_the_routers_choice() -> None:
    """The experts the compiled step reports are the ones the torch step's router modules chose."""
    model = model_with("micro", seed=4)
    fwd = filled(model, 6, [30, 80, 7, 66])
    chosen: list[torch.Tensor] = []
    for layer in fwd.layers:
        layer.mlp.router.register_forward_hook(lambda _m, _i, out: chosen.append(out[2]))
    tokens, positions, slots = torch.tensor([1, 2, 3, 4]), [30, 80, 7, 66], [0, 1, 2, 3]
    with torch.inference_mode():
        native = NativeDecode(fwd)(tokens, torch.tensor(positions), torch.tensor(slots), record=True)[1]
        fwd.decode(tokens, positions, slots)
    assert native is not None and native.shape == (4, len(fwd.layers), 2)
    assert torch.equal(native.sort(dim=-1).values, torch.stack(chosen, dim=1).sort(dim=-1).values)


def test_rows_do_not_depend_on_batch_or_threads() -> None:
    """Each row runs alone through its thread's share: the same bits alone, batched, on 1 or 2 threads."""
    model = model_with("micro")
    fwd = filled(model, 8, [30, 70, 50, 10, 90])
    step, threads = NativeDecode(fwd), torch.get_num_threads()
    with torch.inference_mode():
        batched = step(torch.tensor([5, 6, 7, 8, 9]), torch.tensor([30, 70, 50, 10, 90]), torch.arange(5), False)[0]
        try:
            torch.set_num_threads(1)
            alone = step(torch.tensor([7]), torch.tensor([50]), torch.tensor([2]), False)[0]
        finally:
            torch.set_num_threads(threads)
    assert torch.equal(alone[0], batched[2])


def test_weight_sync_reaches_the_compiled_step() -> None:
    """After load_weights the engine samples from the new weights: its log-probs follow the new model."""
    model, other = model_with(seed=0), model_with(seed=9)
    engine = LocalEngine(model, max_batch=2, max_seq_len=96)
    ids = torch.randint(2, VOCAB, (20,), generator=torch.Generator().manual_seed(3)).tolist()
    engine.load_weights(other.state_dict())

    async def go() -> tuple[float, ...]:
        return (await engine.generate(ids, SamplingParams(max_new_tokens=12, seed=1))).logprobs

    logprobs = asyncio.run(go())
    fresh = LocalEngine(other, max_batch=2, max_seq_len=96, kernel="torch")

    async def ref() -> tuple[float, ...]:
        return (await fresh.generate(ids, SamplingParams(max_new_tokens=12, seed=1))).logprobs

    torch.testing.assert_close(torch.tensor(logprobs), torch.tensor(asyncio.run(ref())), atol=1e-5, rtol=0)


def test_pack_lays_out_16_column_panels() -> None:
    w = torch.arange(3 * 20, dtype=torch.float32).view(3, 20)  # K = 3, N = 20: one full panel, one of 4 columns
    panels = pack(w)
    assert panels.shape == (2, 3, 16)
    assert torch.equal(panels[0], w[:, :16]) and torch.equal(panels[1, :, :4], w[:, 16:])
    assert not panels[1, :, 4:].any()  # zero padding


def test_native_refuses_what_it_cannot_run_with_a_clear_error() -> None:
    model = model_with()
    with pytest.raises(KernelUnavailable, match=r"engine\.kernel=native cannot run here: .*float32 only"):
        LocalEngine(model, max_batch=2, max_seq_len=64, dtype=torch.bfloat16, kernel="native")
    assert LocalEngine(model, max_batch=2, max_seq_len=64, dtype=torch.bfloat16).kernel == "torch"  # auto
    with pytest.raises(ValueError, match="kernel must be 'auto', 'native' or 'torch'"):
        LocalEngine(model, max_batch=2, max_seq_len=64, kernel="cuda")  # type: ignore[arg-type]
    odd = GptOssConfig(**{**model.config.to_dict(), "head_dim": 12})
    assert "head_dim must be 8, 16, 32 or 64" in str(native_unsupported(odd, torch.float32))
    with pytest.raises(KernelUnavailable, match="head_dim must be"):
        LocalEngine(build_model(odd, seed=0), max_batch=2, max_seq_len=64, kernel="native")
    assert LocalEngine(build_model(odd, seed=0), max_batch=2, max_seq_len=64).kernel == "torch"  # auto


def test_missing_build_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    import harmonyrl.engine.local.native as native

    monkeypatch.setattr(native, "library", lambda: None)
    model = model_with()
    with pytest.raises(KernelUnavailable, match="was not built"):
        LocalEngine(model, max_batch=2, max_seq_len=64, kernel="native")
    assert LocalEngine(model, max_batch=2, max_seq_len=64).kernel == "torch"


def test_isa_names_a_build() -> None:
    assert isa() in ("avx2", "generic")
    lib = library()
    assert lib is not None and isinstance(lib.hrl_decode, ctypes._CFuncPtr)
