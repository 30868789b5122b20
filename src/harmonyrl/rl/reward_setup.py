"""Building the ``reward`` section's scorers for a run (:mod:`harmonyrl.rewards.scoring`), and applying them to a
step's rollout. The reward model is loaded in the trainer's process; the judge talks to the policy's own engine,
to an embedded engine of its own (``reward.judge.checkpoint``) or to a vLLM server of its own
(``reward.judge.server``), which this module builds (checks) and closes."""

from __future__ import annotations

import asyncio
import tempfile
from dataclasses import replace
from pathlib import Path

from harmonyrl.config import RunConfig
from harmonyrl.engine.base import Engine
from harmonyrl.engine.vllm import VllmEngine
from harmonyrl.engine.vllm_check import check_server
from harmonyrl.envs.base import EnvFactory
from harmonyrl.harmony.codecs import RunCodec
from harmonyrl.learn.device import resolve_device
from harmonyrl.rewards.judge import Judge
from harmonyrl.rewards.model import load_reward_model
from harmonyrl.rewards.scoring import Rewarder
from harmonyrl.rollout.scheduler import RolloutResult
from harmonyrl.run.setup import load_for, make_engine


class RunRewarder:
    """A run's :class:`Rewarder` and the judge engine it owns (None when the policy's engine judges)."""

    def __init__(self, rewarder: Rewarder, own_engine: Engine | None) -> None:
        self.rewarder = rewarder
        self.own_engine = own_engine
        self._rounds: list[dict[str, float]] = []

    async def rescore(self, rollout: RolloutResult) -> RolloutResult:
        """The rollout with its episodes' rewards recomposed; its reward metrics are kept for :meth:`step_metrics`.

        Dynamic sampling rolls out a step in rounds and drops uniform groups by these rewards, so every round is
        rescored as it arrives."""
        trajs, metrics = await self.rewarder.apply(rollout.trajectories)
        self._rounds.append(metrics)
        return replace(rollout, trajectories=tuple(trajs))

    def step_metrics(self) -> dict[str, float]:
        """The step's reward metrics: each key's mean over the rounds rescored since the last call."""
        rounds, self._rounds = self._rounds, []
        keys = dict.fromkeys(k for r in rounds for k in r)
        return {k: sum(r[k] for r in rounds if k in r) / sum(k in r for r in rounds) for k in keys}

    async def close(self) -> None:
        """Stop the judge's own engine (the policy's engine is the run's to close)."""
        if self.own_engine is not None:
            await self.own_engine.close()


async def make_rewarder(
    config: RunConfig, tok: RunCodec, factory: EnvFactory, policy_engine: Engine
) -> RunRewarder | None:
    """The scorers ``config.reward`` asks for; None when the env's own reward is the whole reward."""
    cfg = config.reward
    if not cfg.active:
        return None
    model = None
    if cfg.model is not None:
        model = load_reward_model(cfg.model)
        model.to(resolve_device(config.device))
    judge, own = None, None
    if cfg.judge is not None:
        engine = policy_engine
        if cfg.judge.checkpoint is not None:
            own, _ = await make_engine(config, load_for(cfg.judge.checkpoint, tok, config.rollout.max_seq_len), None)
            engine = own
        elif (server := cfg.judge.server) is not None:  # preflight here, before any episode needs a verdict
            await asyncio.to_thread(check_server, server, None, config.rollout.max_seq_len)
            own = engine = VllmEngine(server, tok.vocab_size, config.rollout.max_seq_len, Path(tempfile.mkdtemp()))
        judge = Judge(engine, tok, cfg.judge)
    prompts = {t.id: t.prompt for split in ("train", "validation", "test") for t in factory.tasks(split)}
    return RunRewarder(Rewarder(cfg, tok, prompts, model, judge), own)
