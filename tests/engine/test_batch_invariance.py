"""The compiled engine's log-probs do not depend on batch composition: the same request, with the same seed,
gets the same tokens *and the same log-prob bits* alone, beside prompts of other lengths (padding), beside
many prompts, after a shared head was cached by others, and on one or two threads. Batch composition is timing
(a slow tool, async rollouts), so without this two runs of one seed record different behaviour log-probs
(engine/local/prefill.py). The eager kernel is not batch-invariant and is not tested for it."""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import GptOssForCausalLM

from harmonyrl.engine.local.engine import LocalEngine
from harmonyrl.models.tiny_gpt_oss import build_config, build_model
from harmonyrl.types import Generation, SamplingParams

VOCAB = 300


@pytest.fixture(scope="module")
def model() -> GptOssForCausalLM:
    # micro: 4 experts top-2, so the experts' row groups change with the batch (the case that differed before)
    return build_model(build_config("micro", VOCAB, pad_token_id=0, eos_token_id=1), seed=0).eval()


def ids(length: int, salt: int) -> list[int]:
    gen = torch.Generator().manual_seed(97 * length + salt)
    return torch.randint(2, VOCAB, (length,), generator=gen).tolist()


def run(engine: LocalEngine, batch: list[tuple[list[int], SamplingParams]]) -> list[Generation]:
    async def go() -> list[Generation]:
        return list(await asyncio.gather(*(engine.generate(p, s) for p, s in batch)))

    return asyncio.run(go())


TARGET = (ids(20, 0), SamplingParams(temperature=1.0, max_new_tokens=24, seed=1234))
HEAD = ids(24, 5)  # longer than MIN_PREFIX: two fresh prompts sharing it make the engine cache it


def fresh(model: GptOssForCausalLM) -> LocalEngine:
    engine = LocalEngine(model, max_batch=8, max_seq_len=128, kernel="native")
    assert engine.kernel == "native"
    return engine


def others(lengths: tuple[int, ...]) -> list[tuple[list[int], SamplingParams]]:
    return [(ids(n, 3), SamplingParams(max_new_tokens=n % 7 + 2, seed=n)) for n in lengths]


@pytest.mark.parametrize("lengths", [(20, 20, 20), (5, 40, 11), (60,), (3, 3, 3, 3, 3, 3, 3)])
def test_a_request_gets_the_same_logprob_bits_alone_or_beside_others(
    model: GptOssForCausalLM, lengths: tuple[int, ...]
) -> None:
    alone = run(fresh(model), [TARGET])[0]
    beside = run(fresh(model), [*others(lengths), TARGET])[-1]
    assert beside.token_ids == alone.token_ids
    assert beside.logprobs == alone.logprobs  # bit for bit, not within a tolerance


def test_a_cached_shared_head_gives_the_same_bits_as_feeding_the_whole_prompt(model: GptOssForCausalLM) -> None:
    prompt = [*HEAD, *ids(9, 1)]
    params = SamplingParams(temperature=1.0, max_new_tokens=20, seed=77)
    alone = run(fresh(model), [(prompt, params)])[0]
    engine = fresh(model)
    rest = [([*HEAD, *ids(n, 2)], SamplingParams(max_new_tokens=3, seed=n)) for n in (4, 13)]
    shared = run(engine, [*rest, (prompt, params)])[-1]
    assert engine.stats.prefix_tokens_reused == 3 * len(HEAD)  # the head was cached and every prompt reused it
    assert shared.token_ids == alone.token_ids and shared.logprobs == alone.logprobs
    again = run(engine, [(prompt, params)])[0]  # now a cache hit for this prompt alone
    assert again.logprobs == alone.logprobs


def test_the_thread_count_does_not_change_the_bits(model: GptOssForCausalLM) -> None:
    batch = [*others((5, 40, 11)), TARGET]
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = run(fresh(model), batch)
        torch.set_num_threads(2)
        two = run(fresh(model), batch)
    finally:
        torch.set_num_threads(before)
    assert [g.logprobs for g in one] == [g.logprobs for g in two]
