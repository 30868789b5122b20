"""What an RL update reads before its first optimizer step: the step's batch with its token advantages
(:func:`prepare`), the old policy's log-probs and values (:func:`old_policy`, from a no-grad pass unless the
update is a :func:`single_pass`) and the loss's targets after rollout correction and the KL penalty
(:func:`loss_targets`). :mod:`harmonyrl.rl.update` runs the optimizer steps on them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from harmonyrl.algorithms.advantages import (
    a2c_advantages,
    broadcast_to_tokens,
    gae_advantages,
    group_relative_advantages,
    masked_whiten,
    outcome_to_token_rewards,
    reinforce_pp_advantages,
    rloo_advantages,
)
from harmonyrl.algorithms.choices import (
    GAE,
    GRPO,
    RLOO,
    Advantage,
    ReinforcePP,
)
from harmonyrl.algorithms.correction import CorrectionOutput, apply_correction, resolve_old_logp
from harmonyrl.algorithms.distill import reverse_kl_advantage
from harmonyrl.algorithms.kl import kl_reward_penalty
from harmonyrl.config import RLConfig
from harmonyrl.distributed.world import SINGLE, World
from harmonyrl.learn.batch import Batch, collate, micro_batches, score
from harmonyrl.learn.device import to_device
from harmonyrl.models.moe_routing import MoeRouting
from harmonyrl.rl.routing_replay import TrainerRouting, join_routing, mb_routing
from harmonyrl.types import Trajectory

MICRO_BATCH = 32
"""Rows a no-grad pass scores at once when no config says (``rl.micro_batch``'s default)."""


@dataclass(frozen=True)
class Prepared:
    batch: Batch
    n_dropped_zero_var: int
    n_failed: int


def is_group_relative(choice: Advantage) -> bool:
    """Estimators whose advantage is 0 for a group with equal rewards (so such groups can be dropped)."""
    return isinstance(choice, GRPO | RLOO) or (isinstance(choice, ReinforcePP) and choice.group_baseline)


def prepare(
    trajectories: Sequence[Trajectory], cfg: RLConfig, pad_id: int, device: torch.device | None = None
) -> Prepared | None:
    """Drop env failures (they never count as 0 in a group) and, for group-relative estimators, optionally
    the zero-variance groups; the batch on ``device`` (default: the CPU). Returns None when nothing trainable is
    left."""
    ok = [t for t in trajectories if t.failure is None]
    n_failed = len(trajectories) - len(ok)
    kept = ok
    # with a teacher every group trains: equal rewards leave the teacher's per-token term
    if cfg.skip_zero_variance_groups and is_group_relative(cfg.advantage) and cfg.distill is None:
        by_group: dict[int, set[float]] = {}
        for t in ok:
            by_group.setdefault(t.group_id, set()).add(t.reward)
        kept = [t for t in ok if len(by_group[t.group_id]) > 1]
    if not kept:
        return None
    batch = collate(kept, pad_id)
    return Prepared(batch if device is None else to_device(batch, device), len(ok) - len(kept), n_failed)


def token_advantages(
    choice: Advantage, batch: Batch, penalty: torch.Tensor, values: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Advantages ``[B, T-1]`` (and returns ``[B, T-1]`` for critic estimators) of a collated batch.

    ``penalty`` ``[B, T-1]`` is a dense per-token reward added to the outcome reward (a KL penalty, or 0);
    episode-level estimators see it summed over the episode. Critic advantages are whitened over the batch.
    """
    m = batch.loss_mask
    rewards = batch.rewards + (penalty * m).sum(1)
    match choice:
        case GRPO(std_normalize=std):
            return broadcast_to_tokens(group_relative_advantages(rewards, batch.group_ids, std), m), None
        case RLOO():
            return broadcast_to_tokens(rloo_advantages(rewards, batch.group_ids), m), None
        case ReinforcePP(group_baseline=baseline, gamma=gamma):
            groups = batch.group_ids if baseline else None
            return reinforce_pp_advantages(batch.rewards, m, gamma, groups, token_rewards=penalty), None
    # critic estimators (GAE, A2C): per-token rewards against the value head's baseline
    if values is None:
        raise ValueError(f"advantage kind '{choice.kind}' needs a value head")
    token_rewards = outcome_to_token_rewards(batch.rewards, m) + penalty * m
    if isinstance(choice, GAE):
        adv, returns = gae_advantages(token_rewards, values, m, choice.gamma, choice.lam)
    else:
        adv, returns = a2c_advantages(token_rewards, values, m, choice.gamma)
    return masked_whiten(adv, m), returns


@torch.no_grad()
def no_grad_pass(
    model: torch.nn.Module,
    batch: Batch,
    value_head: torch.nn.Module | None = None,
    replay: bool = False,
    micro_batch: int = MICRO_BATCH,
) -> tuple[torch.Tensor, torch.Tensor | None, TrainerRouting]:
    """``[B, T-1]`` log-probs (and values), with the same micro-batch slicing as the update (``micro_batch`` rows:
    bit-exact), and the MoE routing of the pass. ``replay``: route by ``batch.routing`` instead of the router's
    top-k."""
    logp = torch.zeros_like(batch.loss_mask)
    values = torch.zeros_like(batch.loss_mask) if value_head is not None else None
    parts: list[MoeRouting] = []
    row = 0
    for mb in micro_batches(batch, micro_batch):
        parts.append(mb_routing(model, mb, replay))
        scored = score(model, mb.input_ids, mb.attention_mask, value_head=value_head, routing=parts[-1],
                       needed=mb.loss_mask)  # fmt: skip
        logp[row : row + mb.size, : scored.logprobs.shape[1]] = scored.logprobs
        if values is not None and scored.values is not None:
            values[row : row + mb.size, : scored.values.shape[1]] = scored.values
        row += mb.size
    return logp, values, join_routing(parts, batch.input_ids.shape[1])


def single_pass(cfg: RLConfig, batch_size: int, critic: torch.nn.Module | None) -> bool:
    """Whether the update's one forward pass can also be the old-policy pass (saving a no-grad pass over the
    batch: ~30 % of the update's time): one epoch of one minibatch, so the weights have not moved
    when the loss needs the old log-probs; and nothing needs them *before* that pass: no critic values, no
    importance weights or rejection, no KL penalty in the reward, no R2 record to route by."""
    c = cfg.correction
    return (
        cfg.epochs == 1
        and min(cfg.minibatches, batch_size) == 1
        and critic is None
        and c.weights is None
        and c.rejection is None
        and not (cfg.kl.coef > 0 and cfg.kl.use == "reward")
        and cfg.routing_replay == "none"
    )


@dataclass(frozen=True)
class OldPolicy:
    """The policy before the update moves it: what the advantages and the PPO ratio compare against."""

    logp: torch.Tensor
    """``[B, T-1]`` trainer log-probs. With ``single`` they are zeros until the update's one pass fills them in."""
    values: torch.Tensor | None
    """``[B, T-1]`` critic values (critic estimators only)."""
    routing: TrainerRouting | None
    """The MoE routing of the no-grad pass; None with ``single`` (the update's pass records it)."""
    single: bool
    """The update's one forward pass is also the old-policy pass (see :func:`single_pass`)."""


@dataclass(frozen=True)
class LossTargets:
    """Everything the loss reads that is fixed before the first optimizer step (all ``[B, T-1]``)."""

    old_logp: torch.Tensor
    """The PPO ratio's denominator: the trainer's old log-probs, or the sampler's in bypass mode."""
    adv: torch.Tensor
    returns: torch.Tensor | None
    weights: torch.Tensor | None
    """Rollout-correction importance weights (None: not configured)."""
    mask: torch.Tensor
    """The loss mask after rejection."""
    ref_logp: torch.Tensor
    correction: CorrectionOutput


def old_policy(
    model: torch.nn.Module, batch: Batch, cfg: RLConfig, critic: torch.nn.Module | None, world: World = SINGLE
) -> OldPolicy:
    """The old-policy pass: log-probs, values and routing before the update, from a no-grad pass, or left for
    the update's own pass to fill in when it can be the same pass (:func:`single_pass`; under torchrun each
    rank's pass fills in its rows, summed over the ranks after the update)."""
    if cfg.routing_replay == "r3" and batch.routing is None:
        raise ValueError("rl.routing_replay=r3 needs the engine's routing, but the trajectories carry none")
    if single_pass(cfg, batch.size, critic):
        return OldPolicy(torch.zeros_like(batch.loss_mask), None, None, single=True)
    logp, values, routed = no_grad_pass(model, batch, critic, cfg.routing_replay == "r3", cfg.micro_batch)
    return OldPolicy(logp, values, routed, single=False)


def loss_targets(cfg: RLConfig, batch: Batch, old: OldPolicy, ref_logp: torch.Tensor) -> LossTargets:
    """Rollout correction, the ratio's old log-probs, token rewards (+ KL penalty) and advantages."""
    correction = apply_correction(old.logp, batch.sampler_logprobs, batch.loss_mask, cfg.correction)
    # a view of ``old.logp`` (unless bypass): what the single pass fills in reaches the ratio
    old_logp = resolve_old_logp(batch.sampler_logprobs, old.logp, cfg.correction)
    weights = correction.weights if cfg.correction.weights is not None else None
    m = correction.loss_mask  # rejection removes tokens from the loss
    penalty = torch.zeros_like(m)
    if cfg.kl.coef > 0 and cfg.kl.use == "reward":
        penalty = kl_reward_penalty(penalty, old.logp, ref_logp, m, cfg.kl.coef, cfg.kl.estimator)
    adv, returns = token_advantages(cfg.advantage, batch, penalty, old.values)
    d = cfg.distill
    if d is not None and not d.env_reward:
        adv = torch.zeros_like(adv)
    if d is not None and d.kind == "sampled":  # on-policy distillation's per-token term (algorithms/distill.py)
        assert batch.teacher_logprobs is not None, "the learner scores the batch with the teacher first"
        term = reverse_kl_advantage(batch.sampler_logprobs, batch.teacher_logprobs, m, d.weight, d.center)
        adv = adv + term.advantage
    return LossTargets(old_logp, adv, returns, weights, m, ref_logp, correction)
