"""``LocalEngine.replica``: the async pipeline's engine copies (docs/async.md, design 2).

A batch's tokens must depend only on its version's weights and its step's seeds, never on which copy runs it, which
other sequences share its forward passes, or what the copy's prefix cache holds (log-probs: to float rounding).
Model: ``nano`` preset, vocab 300."""

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
    return request.param  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def model() -> GptOssForCausalLM:
    return build_model(build_config("nano", VOCAB, pad_token_id=0, eos_token_id=1), seed=0).eval()


def _prompt(length: int, salt: int) -> list[int]:
    gen = torch.Generator().manual_seed(500 + 13 * length + salt)
    return torch.randint(2, VOCAB, (length,), generator=gen).tolist()


def _run(engine: LocalEngine, requests: list[tuple[list[int], SamplingParams]]) -> list[Generation]:
    async def go() -> list[Generation]:
        out = list(await asyncio.gather(*(engine.generate(p, s) for p, s in requests)))
        await engine.close()
        return out

    return asyncio.run(go())


def _params(seed: int, n: int = 30) -> SamplingParams:
    return SamplingParams(temperature=1.0, max_new_tokens=n, seed=seed)


def test_a_replica_samples_the_same_tokens_and_logprobs_whatever_runs_beside_it(
    model: GptOssForCausalLM, kernel: KernelChoice
) -> None:
    original = LocalEngine(model, kernel=kernel, max_batch=8, max_seq_len=128)
    head = _prompt(24, 0)
    targets = [(head + _prompt(5, i), _params(100 + i)) for i in range(3)]  # share a 24-token head
    # the original first serves other traffic (its prefix cache now holds the head), then the targets batched
    # with unrelated rows of other lengths; the replica serves the targets alone, one at a time, with a cold cache
    _run(original, [(head + _prompt(9, 7), _params(7)), (head + _prompt(4, 8), _params(8))])
    reused = original.stats.prefix_tokens_reused
    assert len(original._prefixes) > 0
    others = [(_prompt(n, 50), _params(n, n)) for n in (6, 41, 17)]
    batched = _run(original, [others[0], targets[0], others[1], targets[1], targets[2], others[2]])
    assert original.stats.prefix_tokens_reused >= reused + 3 * 24  # the targets' head came from the cache
    replica = original.replica()
    assert replica.policy_version == original.policy_version and replica.kernel == original.kernel
    assert len(replica._prefixes) == 0
    alone = [_run(replica, [t])[0] for t in targets]
    for got, want in zip(alone, [batched[1], batched[3], batched[4]], strict=True):
        assert got.token_ids == want.token_ids  # seeded per row and token: the same draws
        if kernel == "native":  # the compiled step's prefill is batch-invariant: the same bits
            assert got.logprobs == want.logprobs
        else:  # eager torch: a padded batched prefill or a cached prefix changes the matmul shapes' rounding
            assert got.logprobs == pytest.approx(want.logprobs, rel=1e-5, abs=1e-5)


def test_a_replica_owns_its_weights(model: GptOssForCausalLM) -> None:
    original = LocalEngine(model, max_batch=2, max_seq_len=64)
    asyncio.run(original.sync_weights(model.state_dict(), 3))
    replica = original.replica()
    assert replica.policy_version == 3
    changed = {name: t + 0.5 if name.endswith("lm_head.weight") else t for name, t in model.state_dict().items()}
    asyncio.run(replica.sync_weights(changed, 4))
    target = (_prompt(10, 1), _params(5, 12))
    before, after = _run(original, [target])[0], _run(replica, [target])[0]
    assert original.policy_version == 3 and after.policy_version == 4 and before.policy_version == 3
    assert before.logprobs != after.logprobs  # the replica's load did not reach the original
    assert _run(LocalEngine(model, max_batch=2, max_seq_len=64), [target])[0].logprobs == before.logprobs
