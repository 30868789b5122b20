"""``harmonyrl train``: SFT warm start, held-out eval, RL steps, held-out eval — top to bottom.

Every run writes to its own folder: ``config.yaml`` (resolved), ``metrics.jsonl``, ``checkpoints/`` and
``summary.json``.

Under torchrun (``world``, docs/distributed.md) every rank runs this same function: rank 0 alone runs the
engine, the rollouts and the evaluations and writes the folder and the console; each RL step's trajectories and
the SFT demonstrations are broadcast from it, and every rank trains its shard of each batch.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from transformers import GptOssForCausalLM

from harmonyrl.config import RunConfig
from harmonyrl.distributed.ray_envs import close_env_pool
from harmonyrl.distributed.world import SINGLE, World, broadcast, share_cores
from harmonyrl.envs.base import EnvFactory
from harmonyrl.errors import CheckpointError
from harmonyrl.harmony.codecs import RunCodec, load_codec
from harmonyrl.models.tiny_gpt_oss import num_parameters
from harmonyrl.rl.phase import open_rl_phase
from harmonyrl.rl.reward_setup import make_rewarder
from harmonyrl.rl.task_choice import task_source
from harmonyrl.rollout.fit import warn_if_prompts_do_not_fit
from harmonyrl.run.checkpoint import save_checkpoint
from harmonyrl.run.checkpoint_files import CheckpointFiles
from harmonyrl.run.clock import RunClock
from harmonyrl.run.context import RunContext
from harmonyrl.run.failure import run_failures
from harmonyrl.run.hooks import NO_HOOKS, RunHooks, hooked_eval
from harmonyrl.run.ranks import open_run_on
from harmonyrl.run.resume import Progress
from harmonyrl.run.setup import (
    adapts_threads,
    check_engine,
    held_out_eval,
    held_out_tasks,
    load_for,
    make_engine,
    make_factory,
    open_run,
    open_writers,
    setup_process,
    sft_plan,
)
from harmonyrl.sft.warm_start import run_sft
from harmonyrl.tasks.factory import check_before_compute
from harmonyrl.telemetry.progress import StepProgress, duration_text
from harmonyrl.telemetry.writers import MultiWriter


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


async def train(
    config: RunConfig,
    console: Console,
    resume: bool = False,
    overwrite: bool = False,
    world: World = SINGLE,
    hooks: RunHooks = NO_HOOKS,
) -> TrainResult:
    """``harmonyrl train``: SFT → held-out eval → RL → held-out eval. ``resume`` continues the run folder
    ``output_dir/run_name`` from its last checkpoint, losing no completed step; ``overwrite`` replaces an
    earlier run folder of that name. ``world``: this process's rank in a torchrun launch. ``hooks``: a caller's
    callbacks at each evaluation and RL step (:mod:`.run_hooks`)."""
    clock = RunClock()  # the run's time: started before setup, continued from the checkpoint on a resume
    setup_process(config.seed, config.threads, adapts_threads(config))
    share_cores(world, config.threads)
    tok = load_codec(config.model.tokenizer)
    factory = make_factory(config)
    try:
        await check_before_compute(config.env, factory, config.seed, _expert_steps(config), config.sft.expert)
        held_out_tasks(config, factory)  # an empty test split fails here, before SFT and before the run folder
        task_source(config, factory, None)  # so does a curriculum the env cannot serve
        if world.distributed:  # rank 0 opens the folder, the others follow (run/ranks.py)
            run_dir, model, saved = open_run_on(world, config, tok, resume, overwrite)
        else:
            run_dir, model, saved = open_run(config, tok, resume, overwrite)
        clock = clock.resumed_from(saved)
        if not world.is_main:  # only rank 0 writes to the run folder, error.log included
            return await _train_in(config, console, clock, tok, factory, run_dir, model, saved, world, hooks)
        with run_failures(run_dir):  # a full disk is one line saying what was kept; any other error is logged there
            return await _train_in(config, console, clock, tok, factory, run_dir, model, saved, world, hooks)
    finally:
        close_env_pool(factory)  # the Ray env workers (scale.ray), whatever happened; nothing otherwise


async def _train_in(
    config: RunConfig,
    console: Console,
    clock: RunClock,
    tok: RunCodec,
    factory: EnvFactory,
    run_dir: Path,
    model: GptOssForCausalLM,
    saved: Progress | None,
    world: World = SINGLE,
    hooks: RunHooks = NO_HOOKS,
) -> TrainResult:
    """``train`` once its run folder is open: everything that writes to it."""
    writer = open_writers(config, run_dir) if world.is_main else MultiWriter([])
    progress = StepProgress(console, config.telemetry.progress_every_s)
    files = CheckpointFiles(config, tok)  # tokenizer + resolved config, beside the weights of every checkpoint
    ctx = RunContext(config, console, run_dir, model, tok, factory, files, writer, progress, world, clock, hooks)
    where = f"  resuming after {saved.phase} step {saved.step}" if saved else ""
    preset = f"  preset {config.preset}" if config.preset else ""
    console.print(
        f"run folder [bold]{run_dir}[/]{preset}  model {config.model.preset} "
        f"({num_parameters(model) / 1e6:.2f} M params)  env {factory.name}  "
        f"engine {check_engine(config, model)}{where}"
    )
    await warn_if_prompts_do_not_fit(factory, tok, config.rollout.max_seq_len, config.rollout.max_new_tokens, console)

    # 1. supervised warm start on the (imperfect) expert's demonstrations
    in_rl = saved is not None and saved.phase == "rl"
    if (plan := sft_plan(config)) is not None and not in_rl:
        console.print(plan, highlight=False, soft_wrap=True)
    if config.sft.steps > 0 and not in_rl:  # from model.init_from too, when sft.steps is given with it
        await run_sft(model, tok, factory, config, writer, progress, run_dir, saved, world, clock)
        if world.is_main:
            save_checkpoint(run_dir / "checkpoints" / "sft", model, None, 0, {}, files)

    # 2. held-out evaluation of the starting policy (read back, not re-run, when resuming inside RL)
    engine = limits = held_out = evaluated = rewarder = None
    if world.is_main:  # the engine is rank 0's alone: the other ranks never generate
        engine, limits = await make_engine(config, model, run_dir)
        rewarder = await make_rewarder(config, tok, factory, engine)  # reward.model / reward.judge; None if unset
        held_out = hooked_eval(held_out_eval(config, engine, factory, tok, limits), hooks)
        evaluated = saved_eval(run_dir) if in_rl else await progress.during("eval", "held-out before RL", held_out())
    before = broadcast(evaluated, world)
    if not in_rl:
        writer.write(0, before, "eval")
    console.print(
        f"held-out before RL: pass@1 [bold]{before['eval/success']:.1%}[/]  "
        f"greedy [bold]{before['eval_greedy/success']:.1%}[/]"
    )

    # 3. RL: rollouts with the current policy → the configured update → new weights to the engine
    rl, first = await open_rl_phase(ctx, engine, limits, rewarder, held_out, saved)
    await rl.run(first)
    final = run_dir / "checkpoints" / "final"
    save_checkpoint(final, model, rl.learner.optimizer, config.rl.steps, {}, files, rl.learner.model, world)
    if engine is None or held_out is None:  # not rank 0: the evaluation and the summary are rank 0's
        return TrainResult(run_dir, before["eval/success"], float("nan"), before["eval_greedy/success"],
                           float("nan"), clock.minutes())  # fmt: skip

    # 4. held-out evaluation of the trained policy
    after = await progress.during("eval", "held-out after RL", held_out())
    writer.write(config.rl.steps, after, "eval")
    await engine.close()
    if rewarder is not None:
        await rewarder.close()
    writer.close()
    result = TrainResult(
        run_dir,
        before["eval/success"],
        after["eval/success"],
        before["eval_greedy/success"],
        after["eval_greedy/success"],
        clock.minutes(),
    )
    write_summary(result)
    console.print(
        f"held-out pass@1: [bold]{result.success_before:.1%} → {result.success_after:.1%}[/]  "
        f"greedy: [bold]{result.greedy_before:.1%} → {result.greedy_after:.1%}[/]  "
        f"in {duration_text(result.minutes)}  ({run_dir})"
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
    setup_process(config.seed, config.threads, adapts_threads(config))
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
        writer = open_writers(config, run_dir)
        if (plan := sft_plan(config)) is not None:
            console.print(plan, highlight=False, soft_wrap=True)
        progress = StepProgress(console, config.telemetry.progress_every_s)
        if config.sft.steps > 0:  # as in ``train``: sft.steps=0 (compare's shared start) needs no expert
            await run_sft(model, tok, factory, config, writer, progress, run_dir, saved)
        close_env_pool(factory)
        writer.close()
        return save_checkpoint(run_dir / "checkpoints" / "sft", model, None, 0, {}, CheckpointFiles(config, tok))


async def eval_only(
    config: RunConfig, checkpoint: Path, console: Console, announce: Callable[[str], str] | None = None
) -> dict[str, float]:
    """``harmonyrl eval``: held-out metrics of a checkpoint; ``announce(env name)`` (which env, and why) is printed
    once the checkpoint has loaded and fits the config, so a bad checkpoint is a one-line error. The env is named
    by its factory, as ``train`` names it (a user's ``units``, not ``custom``)."""
    setup_process(config.seed, config.threads, adapts_threads(config))
    tok = load_codec(config.model.tokenizer)
    factory = make_factory(config)
    await check_before_compute(config.env, factory, config.seed)
    model = load_for(checkpoint, tok, config.rollout.max_seq_len)
    check_engine(config, model)
    if announce is not None:
        console.print(announce(factory.name), highlight=False, soft_wrap=True)
    await warn_if_prompts_do_not_fit(factory, tok, config.rollout.max_seq_len, config.rollout.max_new_tokens, console)
    engine, limits = await make_engine(config, model, None)
    progress = StepProgress(console, config.telemetry.progress_every_s)
    detail = f"evaluating on {config.eval.n_tasks} held-out tasks"
    metrics = await progress.during("eval", detail, held_out_eval(config, engine, factory, tok, limits)())
    await engine.close()
    close_env_pool(factory)
    return metrics
