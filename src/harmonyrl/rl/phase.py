"""The RL phase of ``harmonyrl train``: rollouts with the current policy → the configured update → new weights to
the engine, one step at a time; every step's metrics written and its progress saved, so a kill loses nothing.

Under torchrun every rank runs the steps: rank 0 alone collects the batches (it holds the engine) and broadcasts
each step's episodes; every rank trains its shard of the batch; only rank 0 writes the run folder.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from harmonyrl.config import RunConfig
from harmonyrl.distributed.ray_envs import env_pool_metrics
from harmonyrl.distributed.world import broadcast
from harmonyrl.engine.base import Engine
from harmonyrl.envs.faults import injected_metrics
from harmonyrl.envs.team import TeamFactory
from harmonyrl.models.lora import merged_state_dict
from harmonyrl.rl.collect import make_collect
from harmonyrl.rl.fault_breaker import FaultBreaker, FaultBreakerTripped
from harmonyrl.rl.learner import Learner
from harmonyrl.rl.pipeline import Collect, Collected, Drawn, Pipeline, check_pipeline
from harmonyrl.rl.reference import rl_start_adapters
from harmonyrl.rl.reward_setup import RunRewarder
from harmonyrl.rl.skipped_updates import SkippedUpdates
from harmonyrl.rl.task_choice import task_source
from harmonyrl.rollout.agent_loop import EpisodeLimits
from harmonyrl.rollout.store import step_path, write_step
from harmonyrl.rollout.task_stream import TaskSource
from harmonyrl.rollout.team import role_metrics
from harmonyrl.run.context import RunContext
from harmonyrl.run.resume import Progress, save_progress
from harmonyrl.run.setup import rl_start_model
from harmonyrl.run.state import PhaseState
from harmonyrl.telemetry.episodes import append_episodes
from harmonyrl.telemetry.metrics import summarize_rollouts, time_split
from harmonyrl.types import Trajectory

HeldOut = Callable[[], Awaitable[dict[str, float]]]


@dataclass
class RLPhase:
    """The RL steps of one run and everything they touch. Built by :func:`open_rl_phase`; :meth:`run` runs them."""

    ctx: RunContext
    learner: Learner
    pipeline: Pipeline
    source: TaskSource
    breaker: FaultBreaker
    skipped: SkippedUpdates
    rewarder: RunRewarder | None
    held_out: HeldOut | None
    """The held-out evaluation (rank 0's; None on the other ranks)."""

    async def run(self, first: int) -> None:
        """Steps ``first`` … ``rl.steps`` − 1, then the batches started ahead finish and the engine gets the final
        weights. Stops early after ``rl.guards.stop_after`` guard-skipped steps in a row; raises
        :class:`FaultBreakerTripped` when too many episodes fault."""
        config, progress = self.ctx.config, self.ctx.progress
        progress.start("rl", config.rl.steps, done=first)
        guarded = 0
        for step in range(first, config.rl.steps):
            metrics, skip_reason = await self.step(step)
            progress.advance(f"reward {metrics['rollout/reward']:.2f}  tool {metrics['rollout/tool_call_rate']:.2f}")
            guarded = guarded + 1 if skip_reason == "guard" else 0
            if config.rl.guards.stop_after is not None and guarded >= config.rl.guards.stop_after:
                self.ctx.console.print(f"[red]stopping: {guarded} RL steps in a row skipped by stability guards[/]")
                break
        progress.stop()
        await self.pipeline.drain()  # async: the batches started ahead finish; the engine gets the final weights
        if (note := self.skipped.summary()) is not None:
            self.ctx.progress.warn(note)

    async def step(self, step: int) -> tuple[dict[str, float], str | None]:
        """One RL step: its batch, what the batch shows, the update, the new weights to the engine, the held-out
        evaluation when due, the saved progress. Returns the step's metrics and why the update was skipped."""
        ctx = self.ctx
        t0 = time.perf_counter()
        batch = await self.pipeline.batch(step) if ctx.world.is_main else None
        shared = None if batch is None else (batch.rollout.trajectories, batch.trajectories, batch.metrics)
        trajectories, trained, batch_metrics = broadcast(shared, ctx.world)  # every episode; the ones to train on
        tripped = self.breaker.observe(trajectories)
        metrics = self._observe(batch, trajectories, batch_metrics)
        self._record(step + 1, trajectories, trained)
        t1 = time.perf_counter()
        metrics |= batch.engine_metrics if batch is not None else {}
        update = await self.pipeline.train(self.learner.update, trained)  # async: in a thread, beside the rollouts
        metrics |= update.metrics
        metrics |= self.skipped.observe(update.skip_reason == "nothing_trainable", trajectories)
        if update.applied:
            self.learner.sync(ctx.model)  # under torchrun: the trained shards gathered into rank 0's model
        await self.pipeline.publish(step, lambda: merged_state_dict(ctx.model), update.applied)  # with LoRA: W + BA
        t2 = time.perf_counter()
        metrics |= step_times(t0, t1, t2, trajectories, batch)
        metrics |= self.pipeline.step_metrics() if batch is not None else {}
        metrics |= await self._evaluate_at(step + 1)
        ctx.writer.write(step + 1, metrics, "rl")
        self._save(step + 1, batch)
        if ctx.world.is_main:
            ctx.hooks.on_step(step + 1, ctx.model)
        if tripped is not None:
            ctx.progress.stop()
            raise FaultBreakerTripped(tripped)
        return metrics, update.skip_reason

    def _observe(
        self, batch: Collected | None, trajectories: Sequence[Trajectory], batch_metrics: dict[str, float]
    ) -> dict[str, float]:
        """What the step's episodes show: rewards, tools, time, the sampler's and the task source's figures, per
        role, faults, env workers and the learned or judged reward terms."""
        factory = self.ctx.factory
        metrics = summarize_rollouts(trajectories) | time_split(trajectories) | batch_metrics
        metrics |= self.source.observe(trajectories)
        metrics |= role_metrics(factory, trajectories)  # team/<role>/…: empty for a single-agent env
        if batch is not None:
            metrics |= batch.rollout.fault_metrics() | injected_metrics(batch.factory)
        return metrics | env_pool_metrics(factory) | (self.rewarder.step_metrics() if self.rewarder else {})

    def _record(self, step: int, trajectories: Sequence[Trajectory], trained: Sequence[Trajectory]) -> None:
        """The episodes as people read them, and what the update reads (replay reproduces it), when configured."""
        ctx = self.ctx
        if ctx.config.telemetry.record_episodes and ctx.world.is_main:
            roles = ctx.factory.roles if isinstance(ctx.factory, TeamFactory) else ()  # a team line names its role
            append_episodes(ctx.run_dir / "rollouts" / "episodes.jsonl", trajectories, step, roles)
        if ctx.config.telemetry.record_rollouts and ctx.world.is_main:
            write_step(step_path(ctx.run_dir, step), step, trained)

    async def _evaluate_at(self, done: int) -> dict[str, float]:
        """The held-out evaluation every ``eval.every`` steps (not after the last: the run evaluates then)."""
        every, steps = self.ctx.config.eval.every, self.ctx.config.rl.steps
        if not every or done % every or done >= steps or self.held_out is None:
            return {}
        await self.pipeline.drain()  # the engine evaluates the trainer's weights, not a batch's older ones
        return await self.ctx.progress.during("eval", f"held-out at step {done}", self.held_out())

    def _save(self, done: int, batch: Collected | None) -> None:
        """``checkpoints/last``: weights, optimizer, learner, fault breaker, task source, pipeline and the run's
        time after ``done`` steps."""
        ctx = self.ctx
        save_progress(
            ctx.run_dir,
            ctx.model,
            "rl",
            done,
            self.learner.optimizer,
            ctx.files,
            sharded=self.learner.model,
            world=ctx.world,
            parts=PhaseState(
                learner=self.learner.rule.state_dict(),
                faults=self.breaker.state(),
                sampling=self.pipeline.source_state(batch, self.source.state()),  # async: as this step's draw left it
                pipeline=self.pipeline.state(),
                elapsed_s=ctx.clock.seconds(),
            ),
        )


def step_times(
    t0: float, t1: float, t2: float, trajectories: Sequence[Trajectory], batch: Collected | None
) -> dict[str, float]:
    """``time/*`` of a step that began at ``t0``, had its batch at ``t1`` and its new weights at ``t2``, and the
    sampling throughput over the batch's own collection time."""
    tokens = sum(t.num_sampled for t in trajectories)
    return {
        "time/rollout_s": t1 - t0,
        "time/train_s": t2 - t1,
        "time/step_s": t2 - t0,
        "rollout/tokens_per_s": tokens / max(batch.batch_s if batch is not None else t1 - t0, 1e-9),
    }


async def open_rl_phase(
    ctx: RunContext,
    engine: Engine | None,
    limits: EpisodeLimits | None,
    rewarder: RunRewarder | None,
    held_out: HeldOut | None,
    saved: Progress | None,
) -> tuple[RLPhase, int]:
    """The RL phase and its first step: fresh, or continuing ``saved`` (an RL checkpoint) with its weights,
    optimizer, learner, fault-breaker, task-source and pipeline state. ``engine``: rank 0's (None elsewhere)."""
    config, in_rl = ctx.config, saved is not None and saved.phase == "rl"
    resumed = saved if in_rl else None
    # the reference policy: the model RL started from; with LoRA the run's own model, its adapters switched to the
    # ones RL started from (a resume reads those from the SFT checkpoint; rl/reference.py)
    lora_resume = in_rl and config.model.lora is not None
    start_model = rl_start_model(config, ctx.run_dir, ctx.tok) if in_rl and not lora_resume else ctx.model
    rl_start = rl_start_adapters(ctx.run_dir, ctx.model) if lora_resume else None
    learner = Learner.create(config.rl, start_model, ctx.tok.special.endoftext, float(config.rollout.max_seq_len),
                             config.seed, ctx.world, config.model.precision, rl_start)  # fmt: skip
    if resumed is not None:
        learner.resume(ctx.model, resumed)
    breaker = FaultBreaker(config.rollout.fault_breaker)
    if resumed is not None:
        breaker.load_state(resumed.state.parts.faults or {})
    skipped = SkippedUpdates(warn=ctx.progress.warn)  # one warning style with the warm start's
    source = task_source(config, ctx.factory, resumed)  # the plain stream or a curriculum
    collect: Collect = _no_collect
    if engine is not None and limits is not None:
        collect = make_collect(config, engine, ctx.factory, ctx.tok, limits, source, rewarder)
    # rollouts of later steps run ahead of the update with rl.async.max_staleness > 0 (rl/pipeline.py)
    check_pipeline(config.rl.async_, ctx.world)
    overlap = batches_may_overlap(config, rewarder)
    pipeline = await Pipeline.create(config.rl.async_, engine, collect, resumed.step if resumed else 0,
                                     config.rl.steps, resumed.state.parts.pipeline if resumed else None,
                                     lambda: merged_state_dict(ctx.model), copies=overlap)  # fmt: skip
    phase = RLPhase(ctx, learner, pipeline, source, breaker, skipped, rewarder, held_out)
    return phase, resumed.step if resumed is not None else 0


def batches_may_overlap(config: RunConfig, rewarder: RunRewarder | None) -> bool:
    """Whether async batches may collect at once on engine copies: not when the policy's own engine also judges
    (a copy would judge with a stale policy's weights), nor with dynamic sampling (its extra draws come mid-batch
    and would interleave with another batch's, so the task order would depend on timing; docs/async.md)."""
    judge_apart = rewarder is None or config.reward.judge is None or rewarder.own_engine is not None
    return judge_apart and not config.rl.sampling.filter_uniform_groups


async def _no_collect(step: int, on: Engine) -> Drawn:
    """The collector of a rank without the engine: the pipeline never calls it there."""
    raise RuntimeError(f"step {step}: only rank 0 collects rollouts")
