"""LocalEngine vs the HF model the trainer uses: log-probs, greedy tokens, batch-invariant seeded sampling.

Each fp32 test runs with the compiled decode step and with eager torch (the ``kernel`` fixture).
Model: ``nano`` preset (2 layers: sliding window 32, then full attention), vocab 300. Sequences run past 32
tokens so the sliding-window mask is exercised; prompts of different lengths run concurrently so padded
prefill and ragged decode are exercised.
"""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import GptOssForCausalLM

from harmonyrl.engine.local.engine import LocalEngine
from harmonyrl.engine.local.native import KernelChoice
from harmonyrl.models.tiny_gpt_oss import build_config, build_model
from harmonyrl.types import Generation, SamplingParams

VOCAB = 300


@pytest.fixture(params=["native", "torch"])
def kernel(request: pytest.FixtureRequest) -> KernelChoice:
    """Every fp32 parity test runs on both decode steps: the compiled one (the default where it was built; a
    missing build fails here, it is not skipped) and eager torch."""
    return request.param  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def model() -> GptOssForCausalLM:
    return build_model(build_config("nano", VOCAB, pad_token_id=0, eos_token_id=1), seed=0).eval()


def prompt(length: int, salt: int = 0) -> list[int]:
    gen = torch.Generator().manual_seed(1000 + 7 * length + salt)
    return torch.randint(2, VOCAB, (length,), generator=gen).tolist()


def generate_all(engine: LocalEngine, requests: list[tuple[list[int], SamplingParams]]) -> list[Generation]:
    async def go() -> list[Generation]:
        return list(await asyncio.gather(*(engine.generate(p, s) for p, s in requests)))

    return asyncio.run(go())


def hf_logprobs(model: GptOssForCausalLM, prompt_ids: list[int], generated: tuple[int, ...]) -> torch.Tensor:
    """Trainer-style scoring: one fp32 eager forward over prompt + generated, log_softmax at each sampled id."""
    ids = torch.tensor([prompt_ids + list(generated)])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits.float(), dim=-1)[0]
    positions = torch.arange(len(prompt_ids) - 1, ids.shape[1] - 1)
    return logp[positions, torch.tensor(generated)]


def hf_greedy(model: GptOssForCausalLM, prompt_ids: list[int], steps: int) -> list[int]:
    ids = list(prompt_ids)
    with torch.no_grad():
        for _ in range(steps):
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt_ids) :]


def test_logprobs_match_trainer_for_concurrent_ragged_requests(model: GptOssForCausalLM, kernel: KernelChoice) -> None:
    engine = LocalEngine(model, kernel=kernel, max_batch=8, max_seq_len=128)
    lengths = [1, 6, 23, 45, 60]  # 45 + 40 and 60 + 40 run well past the 32-token window
    requests = [
        (prompt(n), SamplingParams(temperature=1.0, max_new_tokens=40, seed=i, top_p=0.95 if i % 2 else 1.0))
        for i, n in enumerate(lengths)
    ]
    gens = generate_all(engine, requests)
    for (ids, _), gen in zip(requests, gens, strict=True):
        assert len(gen.token_ids) == 40 and gen.finish_reason == "length"
        torch.testing.assert_close(
            torch.tensor(gen.logprobs), hf_logprobs(model, ids, gen.token_ids), atol=1e-5, rtol=0
        )


def test_logprobs_match_when_requests_join_mid_flight(model: GptOssForCausalLM, kernel: KernelChoice) -> None:
    """Late arrivals are prefilled while earlier rows keep decoding (continuous batching)."""
    engine = LocalEngine(model, kernel=kernel, max_batch=4, max_seq_len=128)

    async def go() -> list[tuple[list[int], Generation]]:
        async def one(n: int, delay_steps: int) -> tuple[list[int], Generation]:
            while engine.stats.steps < delay_steps:  # arrive after that many engine steps, however fast they are
                await asyncio.sleep(0)
            ids = prompt(n, salt=1)
            return ids, await engine.generate(ids, SamplingParams(max_new_tokens=30, seed=n))

        return list(await asyncio.gather(*(one(n, d) for n, d in [(10, 0), (35, 3), (4, 6), (50, 9), (17, 12)])))

    results = asyncio.run(go())
    assert engine.stats.steps < sum(len(g.token_ids) for _, g in results)  # rows really shared steps
    for ids, gen in results:
        torch.testing.assert_close(
            torch.tensor(gen.logprobs), hf_logprobs(model, ids, gen.token_ids), atol=1e-5, rtol=0
        )


def test_rows_moved_to_fill_holes_keep_their_cache_and_routing(model: GptOssForCausalLM, kernel: KernelChoice) -> None:
    """Short requests in low slots finish first; the long ones above them move down (keys, values and routing
    copied) and keep matching the trainer; a request seeded alike samples the same tokens moved or not."""
    engine = LocalEngine(model, kernel=kernel, max_batch=6, max_seq_len=128)
    requests = [(prompt(n, salt=3), SamplingParams(max_new_tokens=k, seed=n)) for n, k in
                [(9, 2), (14, 40), (5, 3), (30, 45), (21, 4), (12, 35)]]  # fmt: skip
    gens = generate_all(engine, requests)
    assert engine.stats.slot_moves >= 2
    alone = LocalEngine(model, kernel=kernel, max_batch=6, max_seq_len=128)
    for (ids, params), gen in zip(requests, gens, strict=True):
        torch.testing.assert_close(
            torch.tensor(gen.logprobs), hf_logprobs(model, ids, gen.token_ids), atol=1e-5, rtol=0
        )
        assert gen.routing is not None and (gen.routing.ids[:, 0] >= 0).all()  # layer 0 runs at every position
        assert generate_all(alone, [(ids, params)])[0].token_ids == gen.token_ids


def test_greedy_matches_hf_argmax_loop(model: GptOssForCausalLM, kernel: KernelChoice) -> None:
    engine = LocalEngine(model, kernel=kernel, max_batch=4, max_seq_len=128)
    prompts = [prompt(3), prompt(30), prompt(12)]
    gens = generate_all(engine, [(p, SamplingParams(temperature=0.0, max_new_tokens=36)) for p in prompts])
    for p, gen in zip(prompts, gens, strict=True):
        assert list(gen.token_ids) == hf_greedy(model, p, 36)


def test_same_seed_same_tokens_alone_or_batched(model: GptOssForCausalLM, kernel: KernelChoice) -> None:
    engine = LocalEngine(model, kernel=kernel, max_batch=8, max_seq_len=128)
    target = (prompt(20), SamplingParams(temperature=1.0, max_new_tokens=25, seed=1234, top_k=50))
    alone = generate_all(engine, [target])[0]
    others = [(prompt(n, salt=3), SamplingParams(max_new_tokens=n, seed=n)) for n in (5, 40, 11)]
    batched = generate_all(engine, [others[0], others[1], target, others[2]])[2]
    assert batched.token_ids == alone.token_ids
    reseeded = generate_all(engine, [(target[0], SamplingParams(max_new_tokens=25, seed=4321, top_k=50))])[0]
    assert reseeded.token_ids != alone.token_ids


def test_top_k_one_and_tiny_top_p_are_greedy(model: GptOssForCausalLM, kernel: KernelChoice) -> None:
    engine = LocalEngine(model, kernel=kernel, max_batch=4, max_seq_len=128)
    p = prompt(9)
    greedy, top_k1, top_p_tiny = generate_all(
        engine,
        [
            (p, SamplingParams(temperature=0.0, max_new_tokens=20)),
            (p, SamplingParams(temperature=1.5, top_k=1, max_new_tokens=20, seed=7)),
            (p, SamplingParams(temperature=1.5, top_p=1e-6, max_new_tokens=20, seed=8)),
        ],
    )
    assert top_k1.token_ids == greedy.token_ids == top_p_tiny.token_ids
    assert top_k1.logprobs == pytest.approx(greedy.logprobs, abs=1e-6)  # logprobs ignore top-k / top-p


def shared_prompts(head_len: int, tails: list[int], salt: int = 5) -> list[list[int]]:
    """Prompts that share their first ``head_len`` tokens (an env's system + developer messages)."""
    head = prompt(head_len, salt=salt)
    return [head + prompt(n, salt=salt + 1 + i) for i, n in enumerate(tails)]


def test_shared_prefix_is_cached_and_logprobs_still_match_trainer(
    model: GptOssForCausalLM, kernel: KernelChoice
) -> None:
    # head 40 > the 32-token sliding window: keys copied from the cache must respect the window too
    engine = LocalEngine(model, kernel=kernel, max_batch=8, max_seq_len=128)
    prompts = shared_prompts(40, [1, 7, 20])
    gens = generate_all(engine, [(p, SamplingParams(max_new_tokens=30, seed=i)) for i, p in enumerate(prompts)])
    assert engine.stats.prefix_tokens_reused == 40 * 3
    # a second turn re-sends its first turn (prompt + sampled ids) + a tool result: all it fed is reused
    second_turn = prompts[1] + list(gens[1].token_ids) + prompt(5, salt=9)
    late = generate_all(engine, [(second_turn, SamplingParams(max_new_tokens=20, seed=11))])[0]
    assert engine.stats.prefix_tokens_reused == 40 * 3 + len(prompts[1]) + len(gens[1].token_ids) - 1
    for ids, gen in [*zip(prompts, gens, strict=True), (second_turn, late)]:
        torch.testing.assert_close(
            torch.tensor(gen.logprobs), hf_logprobs(model, ids, gen.token_ids), atol=1e-5, rtol=0
        )


def test_concurrent_second_turns_reuse_their_conversations_and_match_trainer(
    model: GptOssForCausalLM, kernel: KernelChoice
) -> None:
    """Continuing turns of different lengths and a brand-new prompt in one step: per-row prefill starts
    (ragged), tails from 2 to 41 tokens (split into calls by padding), all still the trainer's log-probs."""
    engine = LocalEngine(model, kernel=kernel, max_batch=8, max_seq_len=160)
    firsts = [prompt(n, salt=50 + n) for n in (18, 33, 47)]
    turn1 = generate_all(engine, [(p, SamplingParams(max_new_tokens=n, seed=i)) for i, (p, n) in
                                  enumerate(zip(firsts, (12, 25, 6), strict=True))])  # fmt: skip
    reused = engine.stats.prefix_tokens_reused
    seconds = [p + list(g.token_ids) + prompt(k, salt=60 + k) for p, g, k in zip(firsts, turn1, (1, 9, 3), strict=True)]
    requests = [*seconds, prompt(41, salt=70)]
    turn2 = generate_all(engine, [(p, SamplingParams(max_new_tokens=30, seed=10 + i)) for i, p in enumerate(requests)])
    fed = sum(len(p) + len(g.token_ids) - 1 for p, g in zip(firsts, turn1, strict=True))
    assert engine.stats.prefix_tokens_reused - reused == fed
    for ids, gen in zip(requests, turn2, strict=True):
        torch.testing.assert_close(
            torch.tensor(gen.logprobs), hf_logprobs(model, ids, gen.token_ids), atol=1e-5, rtol=0
        )


def test_prefix_cache_can_be_switched_off_and_a_bad_budget_is_an_error(
    model: GptOssForCausalLM, kernel: KernelChoice
) -> None:
    engine = LocalEngine(model, kernel=kernel, max_batch=8, max_seq_len=128, prefix_cache_mib=0)
    first = prompt(30, salt=80)
    gen = generate_all(engine, [(first, SamplingParams(max_new_tokens=8, seed=0))])[0]
    generate_all(engine, [(first + list(gen.token_ids) + [5], SamplingParams(max_new_tokens=4, seed=1))])
    generate_all(engine, [(p, SamplingParams(max_new_tokens=3, seed=0)) for p in shared_prompts(30, [4, 6])])
    assert engine.stats.prefix_tokens_reused == 0 and len(engine._prefixes) == 0
    for bad in (-1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="prefix_cache_mib"):
            LocalEngine(model, kernel=kernel, prefix_cache_mib=bad)


def test_prefix_cache_is_dropped_with_old_weights(model: GptOssForCausalLM, kernel: KernelChoice) -> None:
    engine = LocalEngine(model, kernel=kernel, max_batch=8, max_seq_len=128)
    prompts = shared_prompts(30, [3, 9])
    generate_all(engine, [(p, SamplingParams(max_new_tokens=5, seed=1)) for p in prompts])
    new = build_model(build_config("nano", VOCAB, pad_token_id=0, eos_token_id=1), seed=1).eval()
    engine.load_weights(new.state_dict())
    reused = engine.stats.prefix_tokens_reused
    gen = generate_all(engine, [(prompts[0], SamplingParams(max_new_tokens=10, seed=2))])[0]
    assert engine.stats.prefix_tokens_reused == reused  # alone and nothing cached: prefilled in full
    torch.testing.assert_close(
        torch.tensor(gen.logprobs), hf_logprobs(new, prompts[0], gen.token_ids), atol=1e-5, rtol=0
    )


def test_short_or_absent_common_prefix_is_not_cached(model: GptOssForCausalLM, kernel: KernelChoice) -> None:
    engine = LocalEngine(model, kernel=kernel, max_batch=8, max_seq_len=128)
    generate_all(engine, [(p, SamplingParams(max_new_tokens=3, seed=0)) for p in shared_prompts(10, [4, 6])])
    generate_all(engine, [(prompt(n, salt=20), SamplingParams(max_new_tokens=3, seed=0)) for n in (25, 30)])
    assert engine.stats.prefix_tokens_reused == 0


def test_batch_mixing_cached_and_uncached_prompts_keeps_row_order(
    model: GptOssForCausalLM, kernel: KernelChoice
) -> None:
    engine = LocalEngine(model, kernel=kernel, max_batch=8, max_seq_len=128)
    a = shared_prompts(24, [2, 5, 8, 3])
    generate_all(engine, [(p, SamplingParams(max_new_tokens=2, seed=0)) for p in a[:2]])  # caches the head
    mixed = [a[2], prompt(33, salt=40), a[3], prompt(12, salt=41)]
    gens = generate_all(engine, [(p, SamplingParams(max_new_tokens=15, seed=i)) for i, p in enumerate(mixed)])
    assert engine.stats.prefix_tokens_reused == 24 * 4
    for ids, gen in zip(mixed, gens, strict=True):
        torch.testing.assert_close(
            torch.tensor(gen.logprobs), hf_logprobs(model, ids, gen.token_ids), atol=1e-5, rtol=0
        )


def test_sinkless_engine_matches_the_sinkless_trainer_kernel_not_the_real_one(kernel: KernelChoice) -> None:
    from harmonyrl.models.attention import set_kernel

    model = build_model(build_config("nano", VOCAB, pad_token_id=0, eos_token_id=1), seed=3).eval()
    with torch.no_grad():  # make the sinks matter
        for layer in model.model.layers:
            layer.self_attn.sinks.fill_(1.5)
    engine = LocalEngine(model, kernel=kernel, max_batch=4, max_seq_len=128, sinks=False)
    ids = prompt(45, salt=50)
    gen = generate_all(engine, [(ids, SamplingParams(max_new_tokens=20, seed=5))])[0]
    sinkless = build_model(build_config("nano", VOCAB, pad_token_id=0, eos_token_id=1), seed=3).eval()
    sinkless.load_state_dict(model.state_dict())
    set_kernel(sinkless, "harmonyrl_sinkless")
    torch.testing.assert_close(torch.tensor(gen.logprobs), hf_logprobs(sinkless, ids, gen.token_ids), atol=1e-5, rtol=0)
    assert (torch.tensor(gen.logprobs) - hf_logprobs(model, ids, gen.token_ids)).abs().max() > 1e-3


def test_bf16_engine_runs_and_its_gap_to_the_fp32_trainer_is_visible(model: GptOssForCausalLM) -> None:
    ids = prompt(40, salt=60)
    fp32 = generate_all(LocalEngine(model, max_batch=2, max_seq_len=128), [(ids, SamplingParams(max_new_tokens=16))])
    bf16_engine = LocalEngine(model, max_batch=2, max_seq_len=128, dtype=torch.bfloat16)
    bf16 = generate_all(bf16_engine, [(ids, SamplingParams(max_new_tokens=16))])
    trainer = hf_logprobs(model, ids, bf16[0].token_ids)
    gap = (torch.tensor(bf16[0].logprobs) - trainer).abs().max().item()
    exact = (torch.tensor(fp32[0].logprobs) - hf_logprobs(model, ids, fp32[0].token_ids)).abs().max().item()
    assert exact <= 1e-5 < gap < 0.5  # bf16 is close, but not within fp32's tolerance
