"""The engine records the experts it ran per position and layer; an fp32 engine routes as the trainer does.

Layout checked exactly: ``len(prompt) + n - 1`` rows (every fed position), layers ``0..L-2`` everywhere, the
last layer only from the last prompt token on (prefill runs it there alone), shared prefixes included.
"""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import GptOssForCausalLM

from harmonyrl.engine.local.engine import LocalEngine
from harmonyrl.learn.batch import score
from harmonyrl.models.moe_routing import MoeRouting
from harmonyrl.models.tiny_gpt_oss import build_config, build_model
from harmonyrl.rollout.agent_loop import _Builder
from harmonyrl.types import Generation, Routing, SamplingParams

VOCAB = 300


@pytest.fixture(scope="module")
def model() -> GptOssForCausalLM:
    m = build_model(build_config("nano", VOCAB, pad_token_id=0, eos_token_id=1), seed=0).eval()
    with torch.no_grad():  # HF initialises routers at ~0 (near-ties); spread them so routing is decisive
        for layer in m.model.layers:
            layer.mlp.router.weight.normal_(0, 0.5, generator=torch.Generator().manual_seed(1))
    return m


def run(engine: LocalEngine, prompts: list[list[int]], n: int) -> list[Generation]:
    async def go() -> list[Generation]:
        params = [SamplingParams(max_new_tokens=n, seed=i) for i in range(len(prompts))]
        return list(await asyncio.gather(*(engine.generate(p, s) for p, s in zip(prompts, params, strict=True))))

    return asyncio.run(go())


def trainer_routing(model: GptOssForCausalLM, ids: list[int]) -> torch.Tensor:
    x = torch.tensor([ids])
    routing = MoeRouting(model, (1, len(ids)))
    with torch.no_grad():
        score(model, x, torch.ones_like(x), routing=routing)
    return routing.own[0]


def test_fp32_engine_routing_equals_trainer_routing(model: GptOssForCausalLM) -> None:
    engine = LocalEngine(model, max_batch=4, max_seq_len=128)
    shared = list(range(10, 30))  # 20 tokens: the engine computes it once and caches it
    first = [[*shared, 40, 41, 42], [*shared, 50], [*shared, 51, 52]]
    second = [[*shared, 43], list(range(60, 67)), [70]]  # a cached-prefix hit, then rows without one
    gens = run(engine, first, n=12)
    assert tuple(shared) in engine._prefixes  # (beside each finished conversation)
    gens += run(engine, second, n=12)
    assert engine.stats.prefix_tokens_reused == 4 * len(shared)
    layers = len(model.model.layers)
    for prompt, gen in zip(first + second, gens, strict=True):
        assert gen.routing is not None
        ids = gen.routing.ids
        fed = len(prompt) + len(gen.token_ids) - 1
        assert ids.shape == (fed, layers, 2) and ids.dtype == torch.int8
        known = (ids >= 0).all(-1)  # [fed, L]
        assert known[:, : layers - 1].all()
        assert not known[: len(prompt) - 1, layers - 1].any() and known[len(prompt) - 1 :, layers - 1].all()
        own = trainer_routing(model, prompt + list(gen.token_ids))[:fed]
        same = (own.sort(-1).values == ids.long().sort(-1).values).all(-1)
        assert same[known].all()


def test_a_continued_conversation_carries_its_first_turns_routing(model: GptOssForCausalLM) -> None:
    engine = LocalEngine(model, max_batch=4, max_seq_len=128)
    first_prompt = list(range(10, 40))
    first = run(engine, [first_prompt], n=10)[0]
    assert first.routing is not None
    fed_first = len(first_prompt) + len(first.token_ids) - 1
    second_prompt = first_prompt + list(first.token_ids) + [5, 6, 7]
    second = run(engine, [second_prompt], n=8)[0]
    assert engine.stats.prefix_tokens_reused == fed_first  # the whole first turn came from the cache
    assert second.routing is not None
    ids = second.routing.ids
    assert torch.equal(ids[:fed_first], first.routing.ids)  # copied with its keys and values
    own = trainer_routing(model, second_prompt + list(second.token_ids))[: ids.shape[0]]
    known = (ids >= 0).all(-1)
    assert known[fed_first:, :-1].all() and known[len(second_prompt) - 1 :].all()
    same = (own.sort(-1).values == ids.long().sort(-1).values).all(-1)
    assert same[known].all()


def test_routing_can_be_switched_off(model: GptOssForCausalLM) -> None:
    engine = LocalEngine(model, max_batch=2, max_seq_len=64, record_routing=False)
    assert run(engine, [[5, 6, 7]], n=3)[0].routing is None


def test_builder_keeps_the_first_routing_of_each_position() -> None:
    """Turn 1 covers positions 0..4 (prompt 3 + 3 sampled - 1); turn 2's prefill re-runs them (values 9 here)
    and adds 5..8; the final token (position 9) was never fed → -1."""
    b = _Builder([1, 2, 3])
    b.add_sampled([4, 5, 6], [-0.1, -0.2, -0.3])
    b.add_routing(Routing(torch.arange(5, dtype=torch.int8).view(5, 1, 1)))
    b.add_context([7, 8])
    b.add_sampled([9, 10], [-0.4, -0.5])
    b.add_routing(Routing(torch.full((9, 1, 1), 9, dtype=torch.int8)))
    full = b.full_routing()
    assert full is not None
    assert full.ids.view(-1).tolist() == [0, 1, 2, 3, 4, 9, 9, 9, 9, -1]
    b.add_routing(None)  # one generation without routing → the trajectory has none
    assert b.full_routing() is None
