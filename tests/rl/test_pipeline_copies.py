"""The pipeline on real engine copies (docs/async.md, design 2): batches of different versions are collected at once,
each on the copy that holds its version, and give the same episodes as when they run one after another.

Model: ``nano`` preset, vocab 300. Version v's weights: the start's, with ``lm_head`` moved by a seeded step per
update, so every version samples differently. A batch: 4 two-turn episodes whose seeds depend on the step only,
with a "tool" sleep between the turns whose length varies from run to run (episode 0's is a long tail); the tasks
(prompt seeds) come from one task cursor shared by the batches, as the run's task source is."""

from __future__ import annotations

import asyncio
import random
from typing import cast

import pytest
import torch
from transformers import GptOssForCausalLM

from fakes import Cursor, SteppingTrainer
from harmonyrl.config import AsyncConfig
from harmonyrl.engine.base import Engine
from harmonyrl.engine.local.engine import LocalEngine
from harmonyrl.models.tiny_gpt_oss import build_config, build_model
from harmonyrl.rl.pipeline import Drawn, Pipeline, StepDraws
from harmonyrl.rollout.sampling import SampledStep
from harmonyrl.rollout.scheduler import RolloutResult
from harmonyrl.types import SamplingParams, Trajectory

VOCAB, STEPS = 300, 5
Turns = tuple[tuple[int, ...], tuple[int, ...]]


@pytest.fixture(scope="module")
def model() -> GptOssForCausalLM:
    return build_model(build_config("nano", VOCAB, pad_token_id=0, eos_token_id=1), seed=0).eval()


class Run(SteppingTrainer):
    """The loop's side: a trainer whose update moves ``lm_head``, and what each step's batch sampled."""

    def __init__(self, model: GptOssForCausalLM) -> None:
        super().__init__(model)
        self.source = Cursor()
        self.sampled: dict[int, tuple[list[Turns], set[int]]] = {}
        self.in_flight = self.most_in_flight = 0

    async def collect(self, step: int, engine: Engine) -> Drawn:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        draws = StepDraws(self.source)  # type: ignore[arg-type]
        tasks = draws.draw(step, 4)  # as sample_step does: before anything is awaited
        episodes = await asyncio.gather(*(self._episode(step, i, task, engine) for i, task in enumerate(tasks)))
        self.in_flight -= 1
        self.sampled[step] = ([turns for turns, _ in episodes], {v for _, v in episodes})
        trajs = tuple(_trajectory(v) for _, v in episodes)
        rollout = RolloutResult(trajs, 0.0)
        return Drawn(SampledStep(rollout, trajs, {}), None, draws.after)  # type: ignore[arg-type]

    async def _episode(self, step: int, i: int, task: int, engine: Engine) -> tuple[Turns, int]:
        gen = torch.Generator().manual_seed(task)
        prompt = torch.randint(2, VOCAB, (6 + 3 * i,), generator=gen).tolist()
        first = await engine.generate(prompt, SamplingParams(max_new_tokens=6, seed=1000 * step + i))
        await asyncio.sleep((0.15 if i == 0 else 0.0) + random.random() * 0.01)  # the tool: timing varies
        reply = [*prompt, *first.token_ids, 7, 8, 9]
        second = await engine.generate(reply, SamplingParams(max_new_tokens=6, seed=1000 * step + i + 500))
        assert first.policy_version == second.policy_version  # an episode never spans a weight load
        return (first.token_ids, second.token_ids), first.policy_version


def _trajectory(version: int) -> Trajectory:
    return Trajectory("t", 0, (1, 1, 1), (0, 1, 0), (0.0,) * 3, 1.0, True, False, None, (), policy_version=version)


def _train(model: GptOssForCausalLM, k: int, copies: bool) -> tuple[Run, list[dict[str, float]]]:
    run = Run(model)

    async def main() -> list[dict[str, float]]:
        engine = LocalEngine(run.model, max_batch=16, max_seq_len=64)
        pipe = await Pipeline.create(AsyncConfig(max_staleness=k), engine, run.collect, 0, STEPS, None, run.weights,
                                     copies=copies)  # fmt: skip
        rows = []
        for step in range(STEPS):
            batch = await pipe.batch(step)
            update = await pipe.train(run.update, batch.trajectories)
            await pipe.publish(step, run.weights, update.applied)
            rows.append(batch.metrics | {"cursor": float(batch.source_state["cursor"])})  # type: ignore[arg-type]
        await pipe.drain()
        assert engine.policy_version == STEPS  # drained: copy 0 holds the trained weights for the evaluation
        await engine.close()
        return rows

    return run, asyncio.run(main())


@pytest.mark.parametrize("k", [1, 2])
def test_concurrent_batches_sample_as_sequential_ones_within_the_staleness_bound(
    model: GptOssForCausalLM, k: int
) -> None:
    together, rows = _train(model, k, copies=True)
    in_turn, _ = _train(model, k, copies=False)
    assert together.most_in_flight > 1 and in_turn.most_in_flight == 1  # the copies did overlap batches
    assert all(r["async/engine_copies"] == k + 1 for r in rows)
    for step in range(STEPS):
        episodes, versions = together.sampled[step]
        assert versions == {max(0, step - k)}  # each episode records the version its copy held
        assert episodes == in_turn.sampled[step][0]  # tokens: the same whichever copy and neighbours
    assert [r["async/staleness_max"] for r in rows] == [float(min(s, k)) for s in range(STEPS)]
    assert all(r["async/dropped"] == 0.0 for r in rows)
    # a checkpoint after step s saves the task position batch s's draw left, though later batches have drawn since
    assert [r["cursor"] for r in rows] == [4.0 * (s + 1) for s in range(STEPS)]
    assert together.source.cursor == 4 * STEPS

    async def first_turns(weights: GptOssForCausalLM) -> list[Turns]:  # the last step's seeds on other weights
        again = Run(weights)
        await again.collect(STEPS - 1, LocalEngine(weights, max_batch=16, max_seq_len=64))
        return again.sampled[STEPS - 1][0]

    # the check can fail: the start's weights and the trained ones sample that batch differently
    assert asyncio.run(first_turns(model)) != asyncio.run(first_turns(together.model))


def test_batches_overlap_only_when_no_copy_would_judge_or_draw_out_of_turn() -> None:
    from harmonyrl.config import load_config
    from harmonyrl.rewards.scoring import Rewarder
    from harmonyrl.rl.phase import batches_may_overlap
    from harmonyrl.rl.reward_setup import RunRewarder

    run = ["rl.async.max_staleness=1", "rl.correction.weights.mode=truncate"]
    plain = load_config(None, run)
    assert batches_may_overlap(plain, None)
    dynamic = load_config(None, [*run, "rl.sampling.filter_uniform_groups=true"])
    assert not batches_may_overlap(dynamic, None)  # its extra draws come mid-batch
    judged = load_config(None, [*run, "reward.judge.max_new_tokens=4"])
    on_policy_engine = RunRewarder(cast(Rewarder, object()), own_engine=None)
    assert not batches_may_overlap(judged, on_policy_engine)  # a copy would judge with stale weights
    on_own_engine = RunRewarder(cast(Rewarder, object()), own_engine=cast(Engine, object()))
    assert batches_may_overlap(judged, on_own_engine)  # the judge has its own engine: copies are free to overlap
