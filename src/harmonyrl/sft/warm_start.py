"""The supervised warm start: demonstrations (the user's file, a user expert or the env's scripted expert; a
team env's every role), then ``sft.steps`` steps of next-token loss on their assistant tokens, resumable."""

from __future__ import annotations

from pathlib import Path

import torch

from harmonyrl.config import RunConfig
from harmonyrl.distributed.fsdp import copy_into, sharded_copy
from harmonyrl.distributed.world import SINGLE, World, broadcast
from harmonyrl.envs.base import EnvFactory
from harmonyrl.envs.team import TeamFactory
from harmonyrl.harmony.codecs import RunCodec
from harmonyrl.run.checkpoint_files import CheckpointFiles
from harmonyrl.run.clock import RunClock
from harmonyrl.run.resume import Progress, load_optimizer, save_progress
from harmonyrl.run.state import PhaseState
from harmonyrl.sft.demo_fit import turn_budget_note
from harmonyrl.sft.demo_report import demos_from_file
from harmonyrl.sft.team_demos import build_team_demos
from harmonyrl.sft.train import build_demos, lr_lambda, sft_batches, sft_step
from harmonyrl.tasks.factory import expert_for
from harmonyrl.telemetry.progress import StepProgress
from harmonyrl.telemetry.writers import MetricsWriter


async def run_sft(
    model: torch.nn.Module,
    tok: RunCodec,
    factory: EnvFactory,
    config: RunConfig,
    writer: MetricsWriter,
    progress: StepProgress,
    run_dir: Path | None = None,
    resume: Progress | None = None,
    world: World = SINGLE,
    clock: RunClock | None = None,
) -> None:
    """Supervised warm start; with ``run_dir`` it saves resumable progress (with ``clock``'s seconds), and
    continues from ``resume``.
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
    if built is not None and (note := turn_budget_note(built, config.rollout.max_new_tokens)) is not None:
        progress.warn(note)  # a turn an episode cannot write: those tasks score 0 whatever RL does
    demos = broadcast(built, world)
    trainee = sharded_copy(model, world) if world.distributed else model
    trainable = [p for p in trainee.parameters() if p.requires_grad]  # with LoRA: the adapters only
    optimizer = torch.optim.AdamW(trainable, lr=cfg.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg.warmup_steps, cfg.steps))
    first = 0
    if resume is not None:
        load_optimizer(resume, model, trainee, optimizer, world)
        schedule.load_state_dict(resume.state.parts.schedule or {})
        first = resume.step
    files = CheckpointFiles(config, tok) if run_dir is not None else None  # built once, copied into each save
    trainee.train()
    progress.start("sft", cfg.steps, done=first)
    for step, batch in enumerate(sft_batches(demos, cfg, config.seed)):
        if step < first:
            continue
        loss = sft_step(trainee, optimizer, batch, tok.special.endoftext, world, config.model.precision,
                        cfg.max_grad_norm)  # fmt: skip
        schedule.step()
        counts = {"sft/demos_used": float(len(demos)), "sft/demos_skipped": float(skipped)} if step == 0 else {}
        writer.write(step, {"sft/loss": loss, "sft/lr": float(schedule.get_last_lr()[0]), **counts}, "sft")
        progress.advance(f"loss {loss:.3f}")
        if run_dir is not None and (step + 1) % cfg.checkpoint_every == 0 and step + 1 < cfg.steps:
            if trainee is not model:
                copy_into(model, trainee, world)
            parts = PhaseState(schedule=schedule.state_dict(), elapsed_s=clock.seconds() if clock is not None else None)
            save_progress(run_dir, model, "sft", step + 1, optimizer, files, sharded=trainee, world=world, parts=parts)
    if trainee is not model:
        copy_into(model, trainee, world)
    progress.stop()
