"""The rollout pipeline (rl/pipeline.py): which policy version samples each step's batch, that batches run
ahead while the update runs in a worker thread, the staleness bound (drop and count), and resume from its state."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping, Sequence

import pytest
import torch

from harmonyrl.config import AsyncConfig
from harmonyrl.learn.update_result import UpdateResult
from harmonyrl.rl.pipeline import Drawn, Pipeline, staleness_metrics
from harmonyrl.rollout.sampling import SampledStep
from harmonyrl.rollout.scheduler import RolloutResult
from harmonyrl.types import Generation, SamplingParams, Trajectory


def _episode(version: int, sampled: int = 2) -> Trajectory:
    return Trajectory("t", 0, (1,) * 3, (0,) + (1,) * sampled + (0,) * (2 - sampled), (0.0,) * 3, 1.0, True,
                      False, None, (), policy_version=version)  # fmt: skip


class WeightsEngine:
    """Holds one weight (its value names the version it came from) and refuses a sync during a batch."""

    def __init__(self) -> None:
        self.policy_version = 0
        self.weight = 0.0
        self.in_flight = False
        self.syncs: list[int] = []

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        raise NotImplementedError

    async def sync_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        assert not self.in_flight, "weights loaded while a batch was being collected"
        self.weight, self.policy_version = float(state_dict["w"]), version
        self.syncs.append(version)

    def metrics_window(self) -> None:
        return None

    async def close(self) -> None: ...


class Trainer:
    """The loop's side: a weight that grows by one per step, and a log of what each batch was sampled with."""

    def __init__(self, engine: WeightsEngine, block_on: int | None = None) -> None:
        self.engine, self.w = engine, 0.0
        self.sampled: dict[int, tuple[int, float]] = {}
        self.started = {s: threading.Event() for s in range(10)}
        self.block_on = block_on

    async def collect(self, step: int, engine: object) -> Drawn:
        self.engine.in_flight = True
        self.started[step].set()
        await asyncio.sleep(0.01)
        self.sampled[step] = (self.engine.policy_version, self.engine.weight)
        self.engine.in_flight = False
        rollout = RolloutResult((_episode(self.engine.policy_version),), 0.01)
        cursor = {"kind": "sequential", "cursor": step + 1}  # the position this step's draw leaves
        return Drawn(SampledStep(rollout, rollout.trajectories, {}), None, cursor)  # type: ignore[arg-type]

    def update(self, trajectories: Sequence[Trajectory]) -> UpdateResult:
        if self.block_on is not None and self.block_on < 5:  # the next batch is collected while this update runs
            assert self.started[self.block_on].wait(timeout=5), "no batch ran during the update"
            self.block_on += 1
        self.w += 1.0
        return UpdateResult({"thread": float(threading.current_thread() is threading.main_thread())})

    def weights(self) -> dict[str, torch.Tensor]:
        return {"w": torch.tensor([self.w])}


async def _run(pipe: Pipeline, trainer: Trainer, steps: range) -> list[dict[str, float]]:
    rows = []
    for step in steps:
        batch = await pipe.batch(step)
        update = await pipe.train(trainer.update, batch.trajectories)
        await pipe.publish(step, trainer.weights, update.applied)
        rows.append(batch.metrics | update.metrics)
    await pipe.drain()
    return rows


@pytest.mark.parametrize("k", [1, 2])
def test_step_s_samples_with_version_s_minus_k_while_the_update_runs(k: int) -> None:
    engine = WeightsEngine()
    trainer = Trainer(engine, block_on=1)

    async def main() -> list[dict[str, float]]:
        pipe = await Pipeline.create(AsyncConfig(max_staleness=k), engine, trainer.collect, 0, 5, None, trainer.weights)
        return await _run(pipe, trainer, range(5))

    rows = asyncio.run(main())
    # version v = the weights after v steps (weight value v): step s samples with max(0, s - k)
    assert trainer.sampled == {s: (max(0, s - k), float(max(0, s - k))) for s in range(5)}
    assert [r["async/staleness_max"] for r in rows] == [float(min(s, k)) for s in range(5)]
    assert all(r["async/dropped"] == 0.0 and r["thread"] == 0.0 for r in rows)
    assert engine.policy_version == 5 and engine.weight == 5.0  # drained: the engine holds the trained weights


def test_synchronous_mode_syncs_applied_updates_only_in_the_callers_thread() -> None:
    engine = WeightsEngine()
    trainer = Trainer(engine)

    async def main() -> None:
        pipe = await Pipeline.create(AsyncConfig(), engine, trainer.collect, 0, 3, None, trainer.weights)
        batch = await pipe.batch(0)
        assert (await pipe.train(trainer.update, batch.trajectories)).metrics["thread"] == 1.0
        await pipe.publish(0, trainer.weights, applied=False)  # a skipped update: nothing to send
        assert engine.syncs == [] and pipe.version == 0
        await pipe.publish(1, trainer.weights, applied=True)
        assert engine.syncs == [2] and engine.weight == 1.0
        assert (await pipe.batch(2)).metrics["async/staleness_max"] == 0.0

    asyncio.run(main())


def test_staleness_bound_drops_and_counts_older_samples() -> None:
    # trainer at version 5, k = 1: lags 0, 1, 2 → the version-3 episode is dropped; a masked fault (no sampled
    # tokens, version 0) has nothing to lag and is kept (the loop counts it as a masked failure)
    trajs = [_episode(5), _episode(4), _episode(3), _episode(0, sampled=0)]
    kept, metrics = staleness_metrics(trajs, version=5, max_staleness=1)
    assert kept == (trajs[0], trajs[1], trajs[3])
    assert metrics == {"async/staleness_mean": 1.0, "async/staleness_max": 2.0, "async/dropped": 1.0}


def test_a_resumed_pipeline_samples_as_an_uninterrupted_one() -> None:
    whole_engine, cut_engine, resumed_engine = WeightsEngine(), WeightsEngine(), WeightsEngine()
    whole, cut = Trainer(whole_engine), Trainer(cut_engine)
    cfg = AsyncConfig(max_staleness=2)

    async def main() -> None:
        pipe = await Pipeline.create(cfg, whole_engine, whole.collect, 0, 6, None, whole.weights)
        await _run(pipe, whole, range(6))
        first = await Pipeline.create(cfg, cut_engine, cut.collect, 0, 6, None, cut.weights)
        await _run(first, cut, range(3))
        state = first.state()  # what the checkpoint after step 3 holds; the batches started ahead are lost
        resumed = Trainer(resumed_engine)
        resumed.w = cut.w  # the checkpoint's weights
        again = await Pipeline.create(cfg, resumed_engine, resumed.collect, 3, 6, state, resumed.weights)
        await _run(again, resumed, range(3, 6))
        assert {**cut.sampled, **resumed.sampled} == whole.sampled

    asyncio.run(main())


@pytest.mark.parametrize("k", [0, 1])
def test_the_checkpointed_task_position_is_the_one_this_steps_draw_left(k: int) -> None:
    """Async: when step 0 is saved, batch 1 has drawn its tasks already (the source's live cursor is 2), but a
    resume regenerates batch 1, so the position saved is batch 0's (1). Sync: the live source, observation and all."""

    async def go() -> dict[str, object]:
        engine = WeightsEngine()
        trainer = Trainer(engine)
        pipe = await Pipeline.create(AsyncConfig(max_staleness=k), engine, trainer.collect, 0, 3, None, trainer.weights)
        batch = await pipe.batch(0)
        await asyncio.sleep(0.05)  # async: batch 1 is collected meanwhile
        saved = pipe.source_state(batch, {"kind": "sequential", "cursor": 2 if k else 1})
        await pipe.publish(0, trainer.weights, applied=True)
        await pipe.drain()
        return saved

    assert asyncio.run(go()) == {"kind": "sequential", "cursor": 1}


def test_the_sync_after_an_update_is_timed_once() -> None:
    """k = 0: the weight sync after an applied update is outside every batch's engine window; the loop reads its
    seconds from ``step_metrics`` (``time/sync_s``), once, and 0 when no update was applied."""

    async def go() -> list[float]:
        engine = WeightsEngine()
        trainer = Trainer(engine)
        pipe = await Pipeline.create(AsyncConfig(), engine, trainer.collect, 0, 3, None, trainer.weights)
        seen = []
        for step, applied in enumerate([True, False]):
            await pipe.batch(step)
            await pipe.publish(step, trainer.weights, applied=applied)
            seen.append(pipe.step_metrics()["time/sync_s"])
        return seen

    applied, skipped = asyncio.run(go())
    assert applied > 0.0 and skipped == 0.0
