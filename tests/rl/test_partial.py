"""Partial rollouts (``rl.async.partial``, rl/partial.py): which version samples each turn, the copies by live
version on real ``nano`` engines, per-token versions through the real agent loop, the per-token staleness bound,
an evaluation's pause mid-run, and the one-line refusals."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping, Sequence

import pytest
import torch
from transformers import GptOssForCausalLM

from fakes import Cursor, SteppingTrainer, calculator_solver
from harmonyrl.config import AsyncConfig, load_config
from harmonyrl.config_tree import ConfigError
from harmonyrl.engine.base import Engine
from harmonyrl.engine.local.engine import LocalEngine
from harmonyrl.engine.turn import EPISODE_TURN
from harmonyrl.harmony.tokenizer import HarmonyTokenizer
from harmonyrl.models.tiny_gpt_oss import build_config, build_model
from harmonyrl.rl.partial import PartialUnsupported, token_staleness, turn_version
from harmonyrl.rl.pipeline import Drawn, Pipeline, StepDraws
from harmonyrl.rollout.agent_loop import EpisodeLimits
from harmonyrl.rollout.sampling import SampledStep
from harmonyrl.rollout.scheduler import EpisodeRequest, RolloutResult, run_episodes
from harmonyrl.tasks.calculator import CalculatorFactory
from harmonyrl.types import Generation, SamplingParams, Trajectory

VOCAB, STEPS, TURNS = 300, 5, 3


def test_turn_j_of_batch_s_samples_version_min_s_b_plus_j() -> None:
    # k = 2, step 5: b = 3; the two updates the batch lives through are taken at turns 1 and 2
    assert [turn_version(5, 2, j) for j in range(4)] == [3, 4, 5, 5]
    assert [turn_version(1, 2, j) for j in range(3)] == [0, 1, 1]  # the first batches start at version 0
    assert [turn_version(4, 1, j) for j in range(3)] == [3, 4, 4]


def _traj(versions: Sequence[int]) -> Trajectory:
    mask = tuple(int(v >= 0) for v in versions)
    spans = len({v for v in versions if v >= 0}) > 1
    oldest = min((v for v in versions if v >= 0), default=0)
    return Trajectory("t", 0, (1,) * len(versions), mask, (0.0,) * len(versions), 1.0, True, False, None, (),
                      policy_version=oldest, token_versions=tuple(versions) if spans else ())  # fmt: skip


def test_tokens_older_than_k_are_masked_and_counted() -> None:
    # trainer at version 5, k = 1: the version-3 tokens lag 2 → masked; an episode of only such tokens is dropped
    mixed = _traj([-1, 3, 3, -1, 4, 5])
    fresh = _traj([-1, 5, 5])
    stale = _traj([-1, 3, 3])
    fault = _traj([-1, -1])
    kept, metrics = token_staleness([mixed, fresh, stale, fault], version=5, max_staleness=1)
    assert kept[0].loss_mask == (0, 0, 0, 0, 1, 1) and kept[1:] == (fresh, fault)
    # lags of the sampled tokens: 2, 2, 1, 0 | 0, 0 | 2, 2 → mean 9 / 8
    assert metrics == {"async/token_staleness_mean": 9 / 8, "async/stale_tokens": 4.0, "async/spanning": 1.0,
                       "async/dropped": 1.0}  # fmt: skip


def test_the_agent_loop_records_each_tokens_version_across_an_update() -> None:
    """A scripted engine whose version is 10 + the turn (as a partial rollout's engine reports it): the call turn's
    tokens carry 10, the answer turn's 11, prompt and tool output -1; the episode's version is the oldest."""
    tok = HarmonyTokenizer.load_default()
    factory = CalculatorFactory(seed=0, n_train=4, n_test=1)
    tasks = factory.tasks("train")
    solver = calculator_solver(tok, tasks)

    class ByTurn:
        policy_version = 10

        async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
            gen = await solver.generate(prompt_ids, params)
            return Generation(gen.token_ids, gen.logprobs, gen.finish_reason, None, 10 + EPISODE_TURN.get())

        async def sync_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None: ...

        def metrics_window(self) -> None:
            return None

        async def close(self) -> None: ...

    limits = EpisodeLimits(max_turns=4, max_new_tokens=64, max_seq_len=512, timeout_s=None)
    reqs = [EpisodeRequest(t, i, i) for i, t in enumerate(tasks[:3])]
    params = SamplingParams(stop_ids=tok.special.stop_ids)
    result = asyncio.run(run_episodes(ByTurn(), factory, tok, reqs, params, limits, 8))
    for traj in result.trajectories:
        assert traj.reward > 0 and len(traj.turns) == 2 and traj.policy_version == 10
        versions = traj.versions()
        assert len(traj.token_versions) == len(traj.token_ids)
        assert all((v >= 0) == bool(m) for v, m in zip(versions, traj.loss_mask, strict=True))
        first_end = traj.loss_mask.index(0, traj.loss_mask.index(1))  # the call turn ends where the tool output begins
        assert {v for v in versions[:first_end] if v >= 0} == {10}
        assert {v for v in versions[first_end:] if v >= 0} == {11}


# ---------------------------------------------------------------- the pipeline on real engine copies


@pytest.fixture(scope="module")
def model() -> GptOssForCausalLM:
    return build_model(build_config("nano", VOCAB, pad_token_id=0, eos_token_id=1), seed=0).eval()


class Run(SteppingTrainer):
    """The loop's side: an update that moves ``lm_head`` by a seeded step; batches of 4 episodes of 3 turns each,
    with a "tool" sleep of random length between the turns (episode 0's long), as the agent loop runs them."""

    def __init__(self, model: GptOssForCausalLM, long_tool_s: float = 0.15) -> None:
        super().__init__(model)
        self.source = Cursor()
        self.long_tool_s = long_tool_s
        self.sampled: dict[int, list[list[tuple[tuple[int, ...], int]]]] = {}
        self.published_during: dict[int, set[int]] = {}
        """Per step: the versions the trainer published while its batch was running."""

    async def collect(self, step: int, engine: Engine) -> Drawn:
        draws = StepDraws(self.source)  # type: ignore[arg-type]
        tasks = draws.draw(step, 4)
        before = self.updates
        episodes = await asyncio.gather(*(self._episode(step, i, t, engine) for i, t in enumerate(tasks)))
        self.published_during[step] = set(range(before + 1, self.updates + 1))
        self.sampled[step] = list(episodes)
        trajs = tuple(_traj([-1, *(v for _, v in turns)]) for turns in episodes)
        rollout = RolloutResult(trajs, 0.0)
        return Drawn(SampledStep(rollout, trajs, {}), None, draws.after)  # type: ignore[arg-type]

    async def _episode(self, step: int, i: int, task: int, engine: Engine) -> list[tuple[tuple[int, ...], int]]:
        prompt = torch.randint(2, VOCAB, (6 + 3 * i,), generator=torch.Generator().manual_seed(task)).tolist()
        turns = []
        for turn in range(TURNS):
            EPISODE_TURN.set(turn)  # as the agent loop does
            gen = await engine.generate(prompt, SamplingParams(max_new_tokens=4, seed=1000 * step + 10 * i + turn))
            turns.append((gen.token_ids, gen.policy_version))
            await asyncio.sleep((self.long_tool_s if i == 0 else 0.0) + random.random() * 0.01)  # timing varies
            prompt = [*prompt, *gen.token_ids, 7, 8]
        return turns


def _partial(model: GptOssForCausalLM, k: int, evaluate_at: int | None = None) -> tuple[Run, list[dict[str, float]]]:
    run = Run(model)

    async def main() -> list[dict[str, float]]:
        engine = LocalEngine(run.model, max_batch=16, max_seq_len=96)
        pipe = await Pipeline.create(AsyncConfig(max_staleness=k, partial=True), engine, run.collect, 0, STEPS, None,
                                     run.weights)  # fmt: skip
        rows = []
        for step in range(STEPS):
            batch = await pipe.batch(step)
            update = await pipe.train(run.update, batch.trajectories)
            await pipe.publish(step, run.weights, update.applied)
            rows.append(batch.metrics)
            if step + 1 == evaluate_at:  # batches ahead wait for versions not trained yet: a drain must not hang
                await asyncio.wait_for(pipe.drain(), timeout=30)
                assert engine.policy_version == step + 1
                reference = LocalEngine(run.model, max_batch=4, max_seq_len=96)
                probe = ([5, 6, 7], SamplingParams(max_new_tokens=4, seed=3))
                assert (await engine.generate(*probe)).token_ids == (await reference.generate(*probe)).token_ids
                await reference.close()
        await pipe.drain()
        assert engine.policy_version == STEPS
        for copy_ in pipe.engines:
            await copy_.close()
        return rows

    return run, asyncio.run(main())


@pytest.mark.parametrize("k", [1, 2])
def test_episodes_take_the_versions_published_while_they_run(model: GptOssForCausalLM, k: int) -> None:
    run, rows = _partial(model, k)
    for step in range(STEPS):
        for turns in run.sampled[step]:
            assert [v for _, v in turns] == [turn_version(step, k, j) for j in range(TURNS)]
    # the weights did change mid-episode: batch s ran while the versions its later turns used were published
    assert any(run.published_during[s] & {turn_version(s, k, j) for j in range(1, TURNS)} for s in range(STEPS))
    assert [r["async/staleness_max"] for r in rows] == [float(min(s, k)) for s in range(STEPS)]  # oldest token
    assert all(r["async/dropped"] == 0.0 and r["async/stale_tokens"] == 0.0 for r in rows)
    assert rows[-1]["async/spanning"] == 4.0 and rows[0]["async/spanning"] == 0.0  # step 0: only version 0 exists

    # each turn's tokens are its version's: the same as one engine holding that version samples alone
    async def alone(step: int, i: int) -> list[tuple[int, ...]]:
        prompt = torch.randint(2, VOCAB, (6 + 3 * i,), generator=torch.Generator().manual_seed(4 * step + i)).tolist()
        out = []
        for turn, (tokens, version) in enumerate(run.sampled[step][i]):
            weights = Run(model)
            for _ in range(version):
                weights.update([])
            engine = LocalEngine(weights.model, max_batch=4, max_seq_len=96)
            gen = await engine.generate(prompt, SamplingParams(max_new_tokens=4, seed=1000 * step + 10 * i + turn))
            await engine.close()
            out.append(gen.token_ids)
            prompt = [*prompt, *tokens, 7, 8]
        return out

    last = STEPS - 1
    assert asyncio.run(alone(last, 1)) == [tokens for tokens, _ in run.sampled[last][1]]


def test_a_partial_run_is_the_same_whatever_the_timing_and_survives_an_evaluation(model: GptOssForCausalLM) -> None:
    """Tokens and versions depend on the steps' seeds and the weights only (a resume regenerates the batches in
    flight): a run with an evaluation's pause after step 2 and other tool timings samples what a plain run does."""
    plain, _ = _partial(model, 1)
    paused, _ = _partial(model, 1, evaluate_at=2)
    assert paused.sampled == plain.sampled


def test_partial_rollouts_are_refused_in_one_line_where_they_cannot_run() -> None:
    truncate = "rl.correction.weights.mode=truncate"
    with pytest.raises(ConfigError, match="max_staleness=0 no update happens while an episode runs"):
        load_config(None, ["rl.async.partial=true", truncate])
    with pytest.raises(ConfigError, match="only the decoupled loss corrects token by token"):
        load_config(None, ["rl.async.partial=true", "rl.async.max_staleness=1"])  # no behaviour weights
    with pytest.raises(ConfigError, match="only the decoupled loss"):
        load_config(None, ["rl.async.partial=true", "rl.async.max_staleness=1", truncate, "rl.correction.bypass=true"])
    with pytest.raises(ConfigError, match="only the decoupled loss"):
        load_config(None, ["rl.async.partial=true", "rl.async.max_staleness=1", truncate, "rl.loss.kind=gspo"])
    with pytest.raises(ConfigError, match="filter_uniform_groups"):
        load_config(None, ["rl.async.partial=true", "rl.async.max_staleness=1", truncate,
                           "rl.sampling.filter_uniform_groups=true"])  # fmt: skip
    assert load_config(None, ["rl.async.partial=true", "rl.async.max_staleness=1", truncate]).rl.async_.partial


def test_partial_rollouts_without_engine_copies_are_refused(model: GptOssForCausalLM) -> None:
    async def main() -> None:
        engine = LocalEngine(model, max_batch=4, max_seq_len=32)
        run = Run(model)
        with pytest.raises(PartialUnsupported, match="needs k \\+ 1 copies of the embedded engine"):
            await Pipeline.create(AsyncConfig(max_staleness=1, partial=True), engine, run.collect, 0, 2, None,
                                  run.weights, copies=False)  # fmt: skip

    asyncio.run(main())
