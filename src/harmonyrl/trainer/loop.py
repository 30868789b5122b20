"""``harmonyrl train``: SFT warm start, held-out eval, RL steps, held-out eval — top to bottom.

Every run writes to its own folder: ``config.yaml`` (resolved), ``metrics.jsonl``, ``checkpoints/`` and
``summary.json``.

Under torchrun (``world``, docs/distributed.md) every rank runs this same function: rank 0 alone runs the
engine, the rollouts and the evaluations and writes the folder and the console; each RL step's trajectories and
the SFT demonstrations are broadcast from it, and every rank trains its shard of each batch.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console
from transformers import GptOssForCausalLM

from harmonyrl.config import RunConfig
from harmonyrl.distributed.fsdp import copy_into, sharded_copy
from harmonyrl.distributed.ray_envs import close_env_pool, env_pool_metrics
from harmonyrl.distributed.world import SINGLE, World, broadcast, share_cores
from harmonyrl.engine.base import Engine
from harmonyrl.envs.base import EnvFactory
from harmonyrl.envs.faults import injected_metrics
from harmonyrl.envs.team import TeamFactory
from harmonyrl.errors import CheckpointError
from harmonyrl.harmony.codecs import RunCodec, load_codec
from harmonyrl.models.lora import merged_state_dict
from harmonyrl.models.tiny_gpt_oss import num_parameters
from harmonyrl.rollout.fit import warn_if_prompts_do_not_fit
from harmonyrl.rollout.sampling import sample_step
from harmonyrl.rollout.scheduler import EpisodeRequest, RolloutResult
from harmonyrl.rollout.store import step_path, write_step
from harmonyrl.rollout.team import role_metrics, run_rollouts
from harmonyrl.tasks.factory import check_before_compute, expert_for
from harmonyrl.telemetry.episodes import append_episodes
from harmonyrl.telemetry.metrics import summarize_rollouts, time_split
from harmonyrl.telemetry.progress import StepProgress
from harmonyrl.telemetry.sinks import MetricsSink, MultiSink
from harmonyrl.trainer.checkpoint import save_checkpoint
from harmonyrl.trainer.checkpoint_files import CheckpointFiles
from harmonyrl.trainer.demo_report import demos_from_file
from harmonyrl.trainer.fault_breaker import FaultBreaker, FaultBreakerTripped
from harmonyrl.trainer.learner import Learner
from harmonyrl.trainer.pipeline import Drawn, Pipeline, StepDraws, check_pipeline
from harmonyrl.trainer.ranks import open_run_on
from harmonyrl.trainer.resume import Progress, load_optimizer, save_progress
from harmonyrl.trainer.reward_setup import make_rewarder
from harmonyrl.trainer.run_errors import run_failures
from harmonyrl.trainer.setup import (
    check_engine,
    held_out_eval,
    held_out_tasks,
    load_for,
    make_engine,
    make_factory,
    open_run,
    open_sinks,
    rl_start_model,
    setup_process,
    sft_plan,
    with_faults,
)
from harmonyrl.trainer.sft import build_demos, lr_lambda, sft_batches, sft_step
from harmonyrl.trainer.skipped_updates import SkippedUpdates
from harmonyrl.trainer.task_choice import task_source
from harmonyrl.trainer.team_demos import build_team_demos
from harmonyrl.types import SamplingParams


@dataclass(frozen=True)
class TrainResult:
    run_dir: Path
    success_before: float
    """Held-out pass@1, sampled at the evaluation temperature (``eval/success``)."""
    success_after: float
    greedy_before: float
    """Held-out greedy success (``eval_greedy/success``)."""
    greedy_after: float
    minutes: float


async def run_sft(
    model: torch.nn.Module,
    tok: RunCodec,
    factory: EnvFactory,
    config: RunConfig,
    sink: MetricsSink,
    progress: StepProgress,
    run_dir: Path | None = None,
    resume: Progress | None = None,
    world: World = SINGLE,
) -> None:
    """Supervised warm start; with ``run_dir`` it saves resumable progress, and continues from ``resume``.
    Under torchrun ``model`` stays plain: a sharded copy trains, and its weights are gathered back into rank 0's
    ``model`` before each save and at the end."""
    cfg = config.sft
    skipped, built = 0, None
    if world.is_main:  # the other ranks get rank 0's demonstrations
        if cfg.demos is not None:  # the user's demonstrations replace the expert's
            built, skipped = await demos_from_file(tok, factory, config, run_dir)
        else:
            expert = expert_for(config.env, cfg.expert)  # ``sft.expert``, else the env's scripted expert
            n_demos = min(len(factory.tasks("train")), cfg.steps * cfg.batch_size)
            tasks = factory.tasks("train")[:n_demos]
            if isinstance(factory, TeamFactory):  # a team env: every role's expert, one demo per role and task
                built = await build_team_demos(tok, factory, tasks, config.seed)
            else:
                built = await build_demos(tok, factory, expert, tasks, config.seed)
    demos = broadcast(built, world)
    trainee = sharded_copy(model, world) if world.distributed else model
    trainable = [p for p in trainee.parameters() if p.requires_grad]  # with LoRA: the adapters only
    optimizer = torch.optim.AdamW(trainable, lr=cfg.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg.warmup_steps, cfg.steps))
    first = 0
    if resume is not None:
        load_optimizer(resume, model, trainee, optimizer, world)
        schedule.load_state_dict(resume.state["schedule"])
        first = resume.step
    files = CheckpointFiles(config, tok) if run_dir is not None else None  # built once, copied into each save
    trainee.train()
    progress.start("sft", cfg.steps, done=first)
    for step, batch in enumerate(sft_batches(demos, cfg, config.seed)):
        if step < first:
            continue
        loss = sft_step(trainee, optimizer, batch, tok.special.endoftext, world, config.model.precision)
        schedule.step()
        counts = {"sft/demos_used": float(len(demos)), "sft/demos_skipped": float(skipped)} if step == 0 else {}
        sink.write(step, {"sft/loss": loss, "sft/lr": float(schedule.get_last_lr()[0]), **counts}, "sft")
        progress.advance(f"loss {loss:.3f}")
        if run_dir is not None and (step + 1) % cfg.checkpoint_every == 0 and step + 1 < cfg.steps:
            if trainee is not model:
                copy_into(model, trainee, world)
            save_progress(run_dir, model, "sft", step + 1, optimizer, files, sharded=trainee, world=world,
                          schedule=schedule.state_dict())  # fmt: skip
    if trainee is not model:
        copy_into(model, trainee, world)
    progress.stop()


async def train(
    config: RunConfig, console: Console, resume: bool = False, overwrite: bool = False, world: World = SINGLE
) -> TrainResult:
    """``harmonyrl train``: SFT → held-out eval → RL → held-out eval. ``resume`` continues the run folder
    ``output_dir/run_name`` from its last checkpoint, losing no completed step; ``overwrite`` replaces an
    earlier run folder of that name. ``world``: this process's rank in a torchrun launch."""
    t_start = time.perf_counter()
    setup_process(config.seed, config.threads, config.adaptive_threads)
    share_cores(world, config.threads)
    tok = load_codec(config.model.tokenizer)
    factory = make_factory(config)
    try:
        await check_before_compute(config.env, factory, config.seed, _expert_steps(config), config.sft.expert)
        held_out_tasks(config, factory)  # an empty test split fails here, before SFT and before the run folder
        task_source(config, factory, None)  # so does a curriculum the env cannot serve
        if world.distributed:  # rank 0 opens the folder, the others follow (trainer/ranks.py)
            run_dir, model, saved = open_run_on(world, config, tok, resume, overwrite)
        else:
            run_dir, model, saved = open_run(config, tok, resume, overwrite)
        if not world.is_main:  # only rank 0 writes to the run folder, error.log included
            return await _train_in(config, console, t_start, tok, factory, run_dir, model, saved, world)
        with run_failures(run_dir):  # a full disk is one line saying what was kept; any other error is logged there
            return await _train_in(config, console, t_start, tok, factory, run_dir, model, saved, world)
    finally:
        close_env_pool(factory)  # the Ray env workers (scale.ray), whatever happened; nothing otherwise


async def _train_in(
    config: RunConfig,
    console: Console,
    t_start: float,
    tok: RunCodec,
    factory: EnvFactory,
    run_dir: Path,
    model: GptOssForCausalLM,
    saved: Progress | None,
    world: World = SINGLE,
) -> TrainResult:
    """``train`` once its run folder is open: everything that writes to it."""
    sink = open_sinks(config, run_dir) if world.is_main else MultiSink([])
    progress = StepProgress(console, config.telemetry.progress_every_s)
    files = CheckpointFiles(config, tok)  # tokenizer + resolved config, beside the weights of every checkpoint
    where = f"  resuming after {saved.phase} step {saved.step}" if saved else ""
    console.print(
        f"run folder [bold]{run_dir}[/]  model {config.model.preset} "
        f"({num_parameters(model) / 1e6:.2f} M params)  env {factory.name}  "
        f"engine {check_engine(config, model)}{where}"
    )
    await warn_if_prompts_do_not_fit(factory, tok, config.rollout.max_seq_len, config.rollout.max_new_tokens, console)

    # 1. supervised warm start on the (imperfect) expert's demonstrations
    in_rl = saved is not None and saved.phase == "rl"
    if (plan := sft_plan(config)) is not None and not in_rl:
        console.print(plan, highlight=False, soft_wrap=True)
    if config.sft.steps > 0 and not in_rl:  # from model.init_from too, when sft.steps is given with it
        await run_sft(model, tok, factory, config, sink, progress, run_dir, saved, world)
        if world.is_main:
            save_checkpoint(run_dir / "checkpoints" / "sft", model, None, 0, {}, files)

    # 2. held-out evaluation of the starting policy (read back, not re-run, when resuming inside RL)
    r = config.rollout
    engine = held_out = evaluated = rewarder = None
    if world.is_main:  # the engine is rank 0's alone: the other ranks never generate
        engine, limits = await make_engine(config, model, run_dir)
        rewarder = await make_rewarder(config, tok, factory, engine)  # reward.model / reward.judge; None if unset
        held_out = held_out_eval(config, engine, factory, tok, limits)
        evaluated = saved_eval(run_dir) if in_rl else await progress.during("eval", "held-out before RL", held_out())
    before = broadcast(evaluated, world)
    if not in_rl:
        sink.write(0, before, "eval")
    console.print(
        f"held-out before RL: pass@1 [bold]{before['eval/success']:.1%}[/]  "
        f"greedy [bold]{before['eval_greedy/success']:.1%}[/]"
    )

    # 3. RL: rollouts with the current policy → the configured update → new weights to the engine
    start_model = rl_start_model(config, run_dir, tok) if in_rl else model
    learner = Learner.create(
        config.rl, start_model, tok.special.endoftext, float(r.max_seq_len), config.seed, world, config.model.precision
    )
    first = 0
    if in_rl and saved is not None:  # continue with the saved weights, optimizer and learner state
        learner.resume(model, saved)
        first = saved.step
    skipped_in_a_row = 0
    breaker = FaultBreaker(r.fault_breaker)
    if in_rl and saved is not None:
        breaker.load_state(saved.state.get("faults", {}))
    skipped_updates = SkippedUpdates(warn=lambda m: console.print(f"[yellow]{m}[/]", soft_wrap=True))
    params = SamplingParams(
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        stop_ids=(tok.special.call, tok.special.return_),
    )
    source = task_source(config, factory, saved if in_rl else None)  # the plain stream or a curriculum

    async def collect(step: int, on: Engine) -> Drawn:
        """Step ``step``'s episodes on engine copy ``on`` (rank 0's; the other ranks get them from it)."""
        step_factory = with_faults(factory, config.env_faults, step)  # ``factory`` itself unless faults are on

        async def run(requests: Sequence[EpisodeRequest]) -> RolloutResult:
            result = await run_rollouts(on, step_factory, tok, requests, params, limits, r.engine.concurrency,
                                        r.retry_faulted_groups)  # fmt: skip  # a team env: its roles in turn
            return result if rewarder is None else await rewarder.rescore(result)  # learned / judged terms

        seed = config.seed * 100_003 + step
        draws = StepDraws(source)  # the source's position after this step's draws, not a later batch's
        sampled = await sample_step(run, draws, step, r.tasks_per_step, r.group_size, seed, config.rl.sampling)
        return Drawn(sampled, step_factory, draws.after)

    # rollouts of later steps run ahead of the update with rl.async.max_staleness > 0 (trainer/pipeline.py)
    check_pipeline(config.rl.async_, world)
    # batches overlap on engine copies unless the policy's engine also judges, or dynamic sampling's extra draws
    # (mid-batch) would interleave with another batch's: then one copy, batches in turn (docs/async.md)
    judge_apart = rewarder is None or config.reward.judge is None or rewarder.own_engine is not None
    overlap = judge_apart and not config.rl.sampling.filter_uniform_groups
    pipeline = await Pipeline.create(config.rl.async_, engine, collect, first, config.rl.steps,
                                     saved.state.get("pipeline") if in_rl and saved is not None else None,
                                     lambda: merged_state_dict(model), copies=overlap)  # fmt: skip
    progress.start("rl", config.rl.steps, done=first)
    for step in range(first, config.rl.steps):
        t0 = time.perf_counter()
        batch = await pipeline.batch(step) if engine is not None else None
        shared = None if batch is None else (batch.rollout.trajectories, batch.trajectories, batch.metrics)
        trajectories, trained, batch_metrics = broadcast(shared, world)  # every episode; the ones to train on
        tripped = breaker.observe(trajectories)
        metrics = summarize_rollouts(trajectories) | time_split(trajectories) | batch_metrics
        metrics |= source.observe(trajectories)
        metrics |= role_metrics(factory, trajectories)  # team/<role>/…: empty for a single-agent env
        if batch is not None:
            metrics |= batch.rollout.fault_metrics() | injected_metrics(batch.factory)
        metrics |= env_pool_metrics(factory) | (rewarder.step_metrics() if rewarder is not None else {})
        if config.telemetry.record_episodes and world.is_main:
            append_episodes(run_dir / "rollouts" / "episodes.jsonl", trajectories, step + 1)
        if config.telemetry.record_rollouts and world.is_main:  # what the update reads: replay reproduces it
            write_step(step_path(run_dir, step + 1), step + 1, trained)
        t1 = time.perf_counter()
        metrics |= batch.engine_metrics if batch is not None else {}
        update = await pipeline.train(learner.update, trained)  # async: in a thread, beside the rollouts
        metrics |= update.metrics
        metrics |= skipped_updates.observe(update.skip_reason == "nothing_trainable", trajectories)
        if update.applied:
            learner.sync(model)  # under torchrun: the trained shards gathered into rank 0's model
        await pipeline.publish(step, lambda: merged_state_dict(model), update.applied)  # with LoRA: W + BA
        t2 = time.perf_counter()
        tokens = sum(t.num_sampled for t in trajectories)
        metrics |= {
            "time/rollout_s": t1 - t0,
            "time/train_s": t2 - t1,
            "time/step_s": t2 - t0,
            "rollout/tokens_per_s": tokens / max(batch.batch_s if batch is not None else t1 - t0, 1e-9),
        }
        metrics |= pipeline.step_metrics() if batch is not None else {}
        if config.eval.every and (step + 1) % config.eval.every == 0 and step + 1 < config.rl.steps and held_out:
            await pipeline.drain()  # the engine evaluates the trainer's weights, not a batch's older ones
            metrics |= await progress.during("eval", f"held-out at step {step + 1}", held_out())
        sink.write(step + 1, metrics, "rl")
        save_progress(
            run_dir,
            model,
            "rl",
            step + 1,
            learner.optimizer,
            files,
            sharded=learner.model,
            world=world,
            learner=learner.extra_state(),
            faults=breaker.state(),
            sampling=pipeline.source_state(batch, source.state()),  # async: as this step's draw left it
            pipeline=pipeline.state(),
        )
        if tripped is not None:
            progress.stop()
            raise FaultBreakerTripped(tripped)
        progress.advance(f"reward {metrics['rollout/reward']:.2f}  tool {metrics['rollout/tool_call_rate']:.2f}")
        skipped_in_a_row = skipped_in_a_row + 1 if update.skip_reason == "guard" else 0
        if config.rl.guards.stop_after is not None and skipped_in_a_row >= config.rl.guards.stop_after:
            console.print(f"[red]stopping: {skipped_in_a_row} RL steps in a row skipped by stability guards[/]")
            break
    progress.stop()
    await pipeline.drain()  # async: the batches started ahead finish; the engine gets the final weights
    if (note := skipped_updates.summary()) is not None:
        console.print(f"[yellow]{note}[/]", soft_wrap=True)
    final = run_dir / "checkpoints" / "final"
    save_checkpoint(final, model, learner.optimizer, config.rl.steps, {}, files, learner.model, world)
    if engine is None or held_out is None:  # not rank 0: the evaluation and the summary are rank 0's
        return TrainResult(run_dir, before["eval/success"], float("nan"), before["eval_greedy/success"],
                           float("nan"), (time.perf_counter() - t_start) / 60)  # fmt: skip

    # 4. held-out evaluation of the trained policy
    after = await progress.during("eval", "held-out after RL", held_out())
    sink.write(config.rl.steps, after, "eval")
    await engine.close()
    if rewarder is not None:
        await rewarder.close()
    sink.close()
    result = TrainResult(
        run_dir,
        before["eval/success"],
        after["eval/success"],
        before["eval_greedy/success"],
        after["eval_greedy/success"],
        (time.perf_counter() - t_start) / 60,
    )
    write_summary(result)
    console.print(
        f"held-out pass@1: [bold]{result.success_before:.1%} → {result.success_after:.1%}[/]  "
        f"greedy: [bold]{result.greedy_before:.1%} → {result.greedy_after:.1%}[/]  "
        f"in {result.minutes:.1f} min  ({run_dir})"
    )
    return result


def _expert_steps(config: RunConfig) -> int:
    """SFT steps an expert must serve (0 when ``sft.demos`` gives the demonstrations instead)."""
    return 0 if config.sft.demos is not None else config.sft.steps


def saved_eval(run_dir: Path) -> dict[str, float]:
    """The held-out evaluation before RL, as the run recorded it (step 0 of ``metrics.jsonl``)."""
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row.get("phase") == "eval" and row.get("step") == 0:
            return {k: v for k, v in row.items() if k not in ("step", "phase")}
    raise CheckpointError(f"'{run_dir}/metrics.jsonl' has no evaluation before RL; cannot resume RL")


def write_summary(result: TrainResult) -> None:
    summary = {
        "success_before": result.success_before,
        "success_after": result.success_after,
        "greedy_success_before": result.greedy_before,
        "greedy_success_after": result.greedy_after,
        "minutes": result.minutes,
    }
    (result.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))


async def sft_only(config: RunConfig, console: Console, resume: bool = False, overwrite: bool = False) -> Path:
    """``harmonyrl sft``: warm start only; returns the checkpoint folder. Resumable like ``train``: progress
    is saved every ``sft.checkpoint_every`` steps, and ``resume`` continues from there, bit for bit."""
    setup_process(config.seed, config.threads, config.adaptive_threads)
    done = config.output_dir / str(config.run_name) / "checkpoints" / "sft"
    if resume and (done / "config.json").is_file():  # written once, after the last step
        console.print(f"'{done.parent.parent}' finished its warm start already: nothing to resume")
        return done
    tok = load_codec(config.model.tokenizer)
    factory = make_factory(config)
    await check_before_compute(config.env, factory, config.seed, _expert_steps(config), config.sft.expert)
    run_dir, model, saved = open_run(config, tok, resume, overwrite)
    if saved is not None and saved.phase != "sft":
        raise CheckpointError(f"'{run_dir}' is past its warm start: continue it with harmonyrl train --resume")
    if saved is not None:
        console.print(f"run folder [bold]{run_dir}[/]  resuming after sft step {saved.step}")
    with run_failures(run_dir):  # as in ``train``: a full disk is one line, any other error is logged there
        sink = open_sinks(config, run_dir)
        if (plan := sft_plan(config)) is not None:
            console.print(plan, highlight=False, soft_wrap=True)
        progress = StepProgress(console, config.telemetry.progress_every_s)
        await run_sft(model, tok, factory, config, sink, progress, run_dir, saved)
        close_env_pool(factory)
        sink.close()
        return save_checkpoint(run_dir / "checkpoints" / "sft", model, None, 0, {}, CheckpointFiles(config, tok))


async def eval_only(
    config: RunConfig, checkpoint: Path, console: Console, announce: str | None = None
) -> dict[str, float]:
    """``harmonyrl eval``: held-out metrics of a checkpoint; ``announce`` (which env, and why) is printed once the
    checkpoint has loaded and fits the config, so a bad checkpoint is a one-line error."""
    setup_process(config.seed, config.threads, config.adaptive_threads)
    tok = load_codec(config.model.tokenizer)
    factory = make_factory(config)
    await check_before_compute(config.env, factory, config.seed)
    model = load_for(checkpoint, tok, config.rollout.max_seq_len)
    check_engine(config, model)
    if announce is not None:
        console.print(announce, highlight=False, soft_wrap=True)
    await warn_if_prompts_do_not_fit(factory, tok, config.rollout.max_seq_len, config.rollout.max_new_tokens, console)
    engine, limits = await make_engine(config, model, None)
    progress = StepProgress(console, config.telemetry.progress_every_s)
    detail = f"evaluating on {config.eval.n_tasks} held-out tasks"
    metrics = await progress.during("eval", detail, held_out_eval(config, engine, factory, tok, limits)())
    await engine.close()
    close_env_pool(factory)
    return metrics
