"""LocalEngine behaviour: stopping, limits, weight loading, cancellation, validation, lifecycle."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch
from transformers import GptOssForCausalLM

from harmonyrl.engine.local.engine import LocalEngine
from harmonyrl.engine.local.stats import EngineStats
from harmonyrl.models.tiny_gpt_oss import build_config, build_model
from harmonyrl.types import Generation, SamplingParams

VOCAB = 300
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=24)


@pytest.fixture(scope="module")
def model() -> GptOssForCausalLM:
    return build_model(build_config("nano", VOCAB, pad_token_id=0, eos_token_id=1), seed=0).eval()


def one(engine: LocalEngine, ids: list[int], params: SamplingParams) -> Generation:
    return asyncio.run(engine.generate(ids, params))


PROMPT = [5, 17, 42, 99, 7, 250, 3]


def test_stop_id_ends_generation_and_is_included(model: GptOssForCausalLM) -> None:
    engine = LocalEngine(model, max_batch=2, max_seq_len=64)
    free = one(engine, PROMPT, GREEDY)
    stop = free.token_ids[5]
    first = free.token_ids.index(stop)
    stopped = one(engine, PROMPT, SamplingParams(temperature=0.0, max_new_tokens=24, stop_ids=(stop, 299)))
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == free.token_ids[: first + 1]
    assert stopped.logprobs == free.logprobs[: first + 1]


def test_max_new_tokens_and_max_seq_len(model: GptOssForCausalLM) -> None:
    engine = LocalEngine(model, max_batch=2, max_seq_len=16)
    short = one(engine, PROMPT, SamplingParams(max_new_tokens=3))
    assert (len(short.token_ids), short.finish_reason) == (3, "length")
    capped = one(engine, PROMPT, SamplingParams(max_new_tokens=100))
    assert (len(capped.token_ids), capped.finish_reason) == (16 - len(PROMPT), "length")


def test_load_weights_changes_outputs_and_refuses_while_busy(model: GptOssForCausalLM) -> None:
    engine = LocalEngine(model, max_batch=2, max_seq_len=64)
    before = one(engine, PROMPT, GREEDY)
    other = build_model(model.config, seed=1)
    engine.load_weights(other.state_dict())
    after = one(engine, PROMPT, GREEDY)
    assert after.token_ids != before.token_ids
    engine.load_weights(model.state_dict())
    assert one(engine, PROMPT, GREEDY) == before

    async def busy() -> None:
        task = asyncio.create_task(engine.generate(PROMPT, SamplingParams(max_new_tokens=40)))
        await asyncio.sleep(0)
        with pytest.raises(RuntimeError, match="in flight"):
            engine.load_weights(model.state_dict())
        await task

    asyncio.run(busy())


def test_private_weights_ignore_trainer_updates(model: GptOssForCausalLM) -> None:
    trainer_model = build_model(model.config, seed=0)
    engine = LocalEngine(trainer_model, max_batch=2, max_seq_len=64)
    before = one(engine, PROMPT, GREEDY)
    with torch.no_grad():
        trainer_model.lm_head.weight.mul_(-1.0)
    assert one(engine, PROMPT, GREEDY) == before


def test_cancelled_request_frees_its_slot(model: GptOssForCausalLM) -> None:
    engine = LocalEngine(model, max_batch=1, max_seq_len=512)

    async def go() -> Generation:
        long = asyncio.create_task(engine.generate(PROMPT, SamplingParams(max_new_tokens=500)))
        while engine.num_free_slots:  # wait until it holds the only slot
            await asyncio.sleep(0.001)
        queued = asyncio.create_task(engine.generate(PROMPT, SamplingParams(max_new_tokens=4)))
        await asyncio.sleep(0.01)
        long.cancel()
        with pytest.raises(asyncio.CancelledError):
            await long
        result = await asyncio.wait_for(queued, timeout=10)
        await engine.close()
        return result

    assert len(asyncio.run(go()).token_ids) == 4
    assert engine.num_free_slots == 1 and engine.num_in_flight == 0


def test_event_loop_keeps_running_while_engine_computes(model: GptOssForCausalLM) -> None:
    engine = LocalEngine(model, max_batch=4, max_seq_len=512)

    async def go() -> int:
        ticks = 0
        gen = asyncio.create_task(engine.generate(PROMPT, SamplingParams(max_new_tokens=200)))
        while not gen.done():
            ticks += 1
            await asyncio.sleep(0)
        await gen
        return ticks

    assert asyncio.run(go()) > 50  # the engine yields to the loop after every step (200 steps here)


def test_close_cancels_pending_and_engine_restarts_lazily(model: GptOssForCausalLM) -> None:
    engine = LocalEngine(model, max_batch=1, max_seq_len=512)

    async def go() -> None:
        tasks = [asyncio.create_task(engine.generate(PROMPT, SamplingParams(max_new_tokens=400))) for _ in range(2)]
        await asyncio.sleep(0.01)
        await engine.close()
        for t in tasks:
            with pytest.raises(asyncio.CancelledError):
                await t

    asyncio.run(go())
    assert engine.num_in_flight == 0
    assert len(one(engine, PROMPT, SamplingParams(max_new_tokens=2)).token_ids) == 2  # new loop, new worker
    assert engine.stats.tokens_generated > 0 and engine.stats.busy_seconds > 0
    assert engine.stats.mean_batch_size >= 1.0


def test_stats_split_the_engines_time_into_compute_bookkeeping_and_idle(model: GptOssForCausalLM) -> None:
    """compute ≤ busy (whole steps); idle counts only the time with nothing queued or running."""
    engine = LocalEngine(model, max_batch=2, max_seq_len=512)

    async def go() -> None:
        await engine.generate(PROMPT, SamplingParams(max_new_tokens=8))
        idle_before = engine.stats.idle_seconds
        await asyncio.sleep(0.05)  # the worker waits for work here
        await engine.generate(PROMPT, SamplingParams(max_new_tokens=8))
        assert engine.stats.idle_seconds - idle_before >= 0.045
        # a window opened during a wait counts that wait only from the window's start
        await asyncio.sleep(0.2)
        earlier, start = engine.stats.settled(), time.perf_counter()
        await asyncio.sleep(0.05)
        in_window = engine.stats.since(earlier, time.perf_counter() - start)["engine/idle_frac"]
        await engine.generate(PROMPT, SamplingParams(max_new_tokens=8))
        assert 0.9 < in_window <= 1.0
        await engine.close()

    asyncio.run(go())
    stats = engine.stats
    assert 0 < stats.prefill_seconds < stats.compute_seconds < stats.busy_seconds
    metrics = stats.since(EngineStats(), wall_s=stats.busy_seconds)
    assert metrics["engine/busy_frac"] == 1.0 and 0 < metrics["engine/compute_frac"] < 1


@pytest.mark.parametrize(
    ("ids", "params", "message"),
    [
        ([], SamplingParams(), "empty"),
        (list(range(2, 66)), SamplingParams(), "max_seq_len"),
        ([5, VOCAB], SamplingParams(), "out of range"),
        (PROMPT, SamplingParams(temperature=-1.0), "temperature"),
        (PROMPT, SamplingParams(temperature=float("nan")), "temperature"),
        (PROMPT, SamplingParams(top_p=0.0), "top_p"),
        (PROMPT, SamplingParams(top_p=1.5), "top_p"),
        (PROMPT, SamplingParams(top_k=-2), "top_k"),
        (PROMPT, SamplingParams(max_new_tokens=0), "max_new_tokens"),
        (PROMPT, SamplingParams(stop_ids=(-1,)), "stop_ids"),
    ],
)
def test_bad_requests_raise_value_error(
    model: GptOssForCausalLM, ids: list[int], params: SamplingParams, message: str
) -> None:
    engine = LocalEngine(model, max_batch=1, max_seq_len=64)
    with pytest.raises(ValueError, match=message):
        one(engine, ids, params)
    assert engine.num_in_flight == 0
