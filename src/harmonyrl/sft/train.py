"""Supervised warm start on expert demonstrations, with the same rendering and loss mask as RL.

A demonstration is rendered exactly as the agent loop would have assembled the episode: the prompt, then
each assistant turn as the model would sample it (mask 1), each tool result as context (mask 0).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from harmonyrl.config import SFTConfig
from harmonyrl.distributed.world import SINGLE, World, shard_rows, sum_all
from harmonyrl.envs.base import EnvFactory
from harmonyrl.errors import NotDemonstrable
from harmonyrl.harmony.render import render_completion, render_prompt
from harmonyrl.harmony.tokenizer import Codec
from harmonyrl.learn.batch import collate, score
from harmonyrl.learn.device import Precision, autocast, to_device
from harmonyrl.learn.optimizer_step import GuardFigures, optimizer_step
from harmonyrl.rollout.agent_loop import initial_messages, observation_ids
from harmonyrl.types import Message, Task, Trajectory

DemoFn = Callable[[Task, random.Random], list[Message]]


@dataclass(frozen=True)
class Demo:
    ids: tuple[int, ...]
    mask: tuple[int, ...]


def render_demo(codec: Codec, prefix: Sequence[Message], demo: Sequence[Message]) -> Demo:
    """Prompt + assistant turns (mask 1) + tool observations (mask 0), as one token stream."""
    ids = render_prompt(codec, prefix, next_role="assistant")
    mask = [0] * len(ids)
    turn: list[Message] = []
    pending_obs: list[Message] = []
    for msg in demo:
        if msg.role == "tool":
            pending_obs.append(msg)
            continue
        if pending_obs:
            obs = observation_ids(codec, pending_obs)
            ids, mask, pending_obs = ids + obs, mask + [0] * len(obs), []
        turn.append(msg)
        if msg.is_tool_call or msg.channel == "final":
            comp = render_completion(codec, turn)
            ids, mask, turn = ids + comp, mask + [1] * len(comp), []
    if turn or pending_obs:
        raise ValueError("a demonstration must end with a final answer or a tool call")
    return Demo(tuple(ids), tuple(mask))


async def expert_episodes(
    factory: EnvFactory, expert: DemoFn, tasks: Sequence[Task], seed: int
) -> list[tuple[list[Message], list[Message]]]:
    """(prompt, demonstration) per task: the env's opening messages as rollouts see them, then the expert's turns
    and tool results. One seeded stream over the tasks in order, so the same arguments give the same episodes."""
    rng = random.Random(seed)
    episodes = []
    for task in tasks:
        env = factory.make(task)
        prefix = initial_messages(env, await env.reset())
        await env.close()
        try:
            demo = expert(task, rng)
        except NotDemonstrable as e:
            raise NotDemonstrable(
                f"{e}; the scripted expert only demonstrates the environment's generated tasks: with your own "
                "tasks_file, skip the warm start (sft.steps=0) or start from a checkpoint (model.init_from=DIR)"
            ) from e
        episodes.append((prefix, demo))
    return episodes


async def build_demos(
    codec: Codec, factory: EnvFactory, expert: DemoFn, tasks: Sequence[Task], seed: int
) -> list[Demo]:
    """The expert's demonstrations of ``tasks``, rendered (see :func:`expert_episodes`)."""
    return [render_demo(codec, prefix, demo) for prefix, demo in await expert_episodes(factory, expert, tasks, seed)]


def lr_lambda(warmup: int, total: int) -> Callable[[int], float]:
    """Linear warm-up then cosine decay to 10 % of the peak."""

    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return f


def sft_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    demos: Sequence[Demo],
    pad_id: int,
    world: World = SINGLE,
    precision: Precision = "fp32",
    max_grad_norm: float = 1.0,
) -> float:
    """One optimizer step of masked next-token cross-entropy (token-mean over sampled positions), on the model's
    device; returns the batch's loss. ``precision`` bf16 runs the forward under autocast. Only trainable
    parameters (LoRA: the adapters) are clipped (to ``max_grad_norm``) and stepped; a non-finite loss or
    gradient is not stepped on (:func:`~harmonyrl.learn.optimizer_step.optimizer_step`).

    Under torchrun every rank is given the whole batch and trains its rows of it (``model`` sharded with FSDP,
    gradients summed): each rank's loss is divided by the whole batch's token count, so the summed gradient is
    the one-process gradient. A rank with no rows runs a zero-weighted pass, as FSDP needs every rank's."""
    trajs = [Trajectory("demo", 0, d.ids, d.mask, (0.0,) * len(d.ids), 0.0, True, False, None, ()) for d in demos]
    device = next(model.parameters()).device
    batch = to_device(collate(trajs, pad_id), device)
    total = batch.loss_mask.sum().clamp(min=1.0)  # the global normaliser: every rank's tokens
    mine = shard_rows(batch.size, world)
    part = batch if not world.distributed else batch.select(mine if len(mine) else torch.arange(1))
    summed = torch.zeros(())

    def backward() -> GuardFigures:
        nonlocal summed
        with autocast(precision, device):
            scored = score(
                model, part.input_ids, part.attention_mask, needed=part.loss_mask, share_prefix=not world.distributed
            )
        loss = -(scored.logprobs * part.loss_mask).sum() / total * float(len(mine) > 0)
        loss.backward()
        summed = sum_all(loss.detach().clone(), world)
        return GuardFigures(float(summed))

    optimizer_step(optimizer, [p for p in model.parameters() if p.requires_grad], backward, max_grad_norm)
    return float(summed)


def sft_batches(demos: Sequence[Demo], cfg: SFTConfig, seed: int) -> list[list[Demo]]:
    """The ``cfg.steps`` batches, sampled with a seeded shuffle (epoch after epoch)."""
    rng = random.Random(seed)
    order: list[int] = []
    out = []
    for _ in range(cfg.steps):
        if len(order) < cfg.batch_size:
            fresh = list(range(len(demos)))
            rng.shuffle(fresh)
            order.extend(fresh)
        out.append([demos[i] for i in order[: cfg.batch_size]])
        del order[: cfg.batch_size]
    return out
