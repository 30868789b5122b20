"""One on-policy RL update (the PPO family) from a step's trajectories.

The order mirrors the data flow: filter → collate → no-grad passes (old log-probs and values, reference) →
rollout correction → token rewards (+ KL penalty) → advantages → epochs × minibatches of policy loss
(+ value loss, KL loss, entropy bonus) → stability guards → metrics. When the update is a single pass that
nothing before the loss reads old log-probs for (:func:`single_pass`, the default config), that pass
supplies them and the no-grad pass is skipped. The first pass also records the MoE routing
(``routing/*`` metrics); with ``routing_replay`` r2 / r3 every pass routes by a fixed record
(:mod:`harmonyrl.trainer.routing_replay`). The math lives in :mod:`harmonyrl.algorithms`;
which function runs is chosen by ``match`` on the typed choices in ``RLConfig``. The off-policy soft-Q row
has its own update in :mod:`harmonyrl.trainer.soft_q_learner`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from transformers import GptOssForCausalLM

from harmonyrl.algorithms.advantages import (
    a2c_advantages,
    broadcast_to_tokens,
    gae_advantages,
    group_relative_advantages,
    masked_whiten,
    outcome_to_token_rewards,
    reinforce_pp_advantages,
    rloo_advantages,
    value_loss,
)
from harmonyrl.algorithms.choices import (
    A2C,
    GAE,
    GRPO,
    RLOO,
    Advantage,
    GSPOLoss,
    PolicyGradient,
    PPOClip,
    ReinforcePP,
)
from harmonyrl.algorithms.correction import apply_correction, resolve_old_logp
from harmonyrl.algorithms.kl import kl_estimate, kl_k3, kl_loss, kl_reward_penalty
from harmonyrl.algorithms.losses import (
    AggregationMode,
    PolicyLossOutput,
    entropy_bonus,
    gspo_loss,
    masked_token_mean,
    policy_gradient_loss,
    ppo_clip_loss,
)
from harmonyrl.algorithms.mismatch import mismatch_metrics
from harmonyrl.config import RLConfig
from harmonyrl.models.moe_routing import MoeRouting
from harmonyrl.trainer.batch import Batch, collate, micro_batches, score
from harmonyrl.trainer.guards import restore, take_snapshot, trip_reason
from harmonyrl.trainer.routing_replay import TrainerRouting, join_routing, mb_routing, routing_metrics
from harmonyrl.types import Trajectory

MICRO_BATCH = 32


@dataclass(frozen=True)
class Prepared:
    batch: Batch
    n_dropped_zero_var: int
    n_failed: int


def is_group_relative(choice: Advantage) -> bool:
    """Estimators whose advantage is 0 for a group with equal rewards (so such groups can be dropped)."""
    return isinstance(choice, GRPO | RLOO) or (isinstance(choice, ReinforcePP) and choice.group_baseline)


def prepare(trajectories: Sequence[Trajectory], cfg: RLConfig, pad_id: int) -> Prepared | None:
    """Drop env failures (they never count as 0 in a group) and, for group-relative estimators, optionally
    the zero-variance groups. Returns None when nothing trainable is left."""
    ok = [t for t in trajectories if t.failure is None]
    n_failed = len(trajectories) - len(ok)
    kept = ok
    if cfg.skip_zero_variance_groups and is_group_relative(cfg.advantage):
        by_group: dict[int, set[float]] = {}
        for t in ok:
            by_group.setdefault(t.group_id, set()).add(t.reward)
        kept = [t for t in ok if len(by_group[t.group_id]) > 1]
    if not kept:
        return None
    return Prepared(collate(kept, pad_id), len(ok) - len(kept), n_failed)


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


def policy_loss(
    cfg: RLConfig,
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    weights: torch.Tensor | None,
    norm: float | None,
) -> PolicyLossOutput:
    """The configured policy loss on one micro-batch (all ``[b, t]``)."""
    agg: AggregationMode = cfg.aggregation
    match cfg.loss:
        case PPOClip(clip_low=lo, clip_high=hi, dual_clip=dual):
            return ppo_clip_loss(logp, old_logp, adv, mask, lo, hi, dual_clip=dual, weights=weights,
                                 aggregation=agg, norm=norm)  # fmt: skip
        case GSPOLoss(clip_low=lo, clip_high=hi):
            return gspo_loss(logp, old_logp, adv, mask, lo, hi, weights=weights, aggregation=agg, norm=norm)
        case PolicyGradient():
            return policy_gradient_loss(logp, adv, mask, weights=weights, aggregation=agg, norm=norm)
    raise ValueError(f"loss kind '{cfg.loss.kind}' is not an on-policy loss; use trainer.soft_q")


def _units(mask: torch.Tensor, agg: AggregationMode) -> torch.Tensor:
    """What an aggregation averages over: tokens (token-mean) or non-empty sequences (seq-* modes)."""
    return mask.sum() if agg == "token-mean" else mask.bool().any(-1).sum().to(mask.dtype)


@torch.no_grad()
def _no_grad_pass(
    model: torch.nn.Module, batch: Batch, value_head: torch.nn.Module | None = None, replay: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None, TrainerRouting]:
    """``[B, T-1]`` log-probs (and values), with the same micro-batch slicing as the update (bit-exact), and
    the MoE routing of the pass. ``replay``: route by ``batch.routing`` instead of the router's top-k."""
    logp = torch.zeros_like(batch.loss_mask)
    values = torch.zeros_like(batch.loss_mask) if value_head is not None else None
    parts: list[MoeRouting] = []
    row = 0
    for mb in micro_batches(batch, MICRO_BATCH):
        parts.append(mb_routing(model, mb, replay))
        scored = score(model, mb.input_ids, mb.attention_mask, value_head=value_head, routing=parts[-1])
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


def rl_update(
    model: GptOssForCausalLM,
    optimizer: torch.optim.Optimizer,
    prepared: Prepared,
    cfg: RLConfig,
    ref_model: torch.nn.Module | None,
    value_head: torch.nn.Module | None = None,
    norm: float | None = None,
) -> dict[str, float]:
    """Apply ``cfg.epochs × cfg.minibatches`` optimizer steps (or none, if a guard trips); return metrics.

    ``value_head`` is required by critic estimators (its parameters must be in ``optimizer``); ``norm`` is the
    constant of ``seq-mean-token-sum-norm`` (the episode token budget).
    """
    batch = prepared.batch
    # a guard checks each optimizer step before it is applied; only a later step's trip must undo earlier ones
    planned = cfg.epochs * min(cfg.minibatches, batch.size)
    snapshot = take_snapshot(model, value_head, optimizer) if planned > 1 else None
    model.eval()  # no dropout: old and new log-probs must come from the same function
    critic = value_head if isinstance(cfg.advantage, GAE | A2C) else None
    if cfg.routing_replay == "r3" and batch.routing is None:
        raise ValueError("rl.routing_replay=r3 needs the engine's routing, but the trajectories carry none")
    # One update pass that is also the old-policy pass: see ``single_pass``. Its log-probs are filled in below,
    # before the loss reads them; everything else that reads them runs after the update.
    single = single_pass(cfg, batch.size, critic)
    recorded: list[MoeRouting] = []  # the single pass's per-micro-batch routing, joined after the loop
    routed: TrainerRouting | None = None
    if single:
        trainer_old, old_values = torch.zeros_like(batch.loss_mask), None
    else:
        trainer_old, old_values, routed = _no_grad_pass(model, batch, critic, replay=cfg.routing_replay == "r3")
    replay = cfg.routing_replay != "none"
    train_batch = batch
    if cfg.routing_replay == "r2":  # every later pass of this step routes as the first did (R3: as the sampler)
        assert routed is not None, "single_pass() is never chosen under R2"
        train_batch = replace(batch, routing=routed.used)
    # KL to the reference: every token when it is trained on or guarded; else a one-micro-batch estimate
    # for the metric (a full reference pass would cost a fifth of the update).
    needs_ref = ref_model is not None and (cfg.kl.coef > 0 or cfg.guards.max_kl is not None)
    ref_logp = _no_grad_pass(ref_model, batch)[0] if needs_ref and ref_model is not None else trainer_old
    correction = apply_correction(trainer_old, batch.sampler_logprobs, batch.loss_mask, cfg.correction)
    old_logp = resolve_old_logp(batch.sampler_logprobs, trainer_old, cfg.correction)
    weights = correction.weights if cfg.correction.weights is not None else None
    m = correction.loss_mask  # rejection removes tokens from the loss
    penalty = torch.zeros_like(m)
    if cfg.kl.coef > 0 and cfg.kl.use == "reward":
        penalty = kl_reward_penalty(penalty, trainer_old, ref_logp, m, cfg.kl.coef, cfg.kl.estimator)
    adv, returns = token_advantages(cfg.advantage, batch, penalty, old_values)
    value_cfg = cfg.advantage if isinstance(cfg.advantage, GAE | A2C) else None

    order = torch.arange(batch.size)
    n_mb = min(cfg.minibatches, batch.size)
    sums = {"loss": 0.0, "clip": 0.0, "entropy": 0.0, "value_loss": 0.0, "kl_live": 0.0}
    norms, first_dev, tripped = [], None, None
    for _ in range(cfg.epochs):
        for idx in torch.tensor_split(order, n_mb):
            total = _units(m[idx], cfg.aggregation).clamp(min=1.0)
            optimizer.zero_grad(set_to_none=True)
            sub = train_batch.select(idx)
            row, dev, step_loss, kl_live, step_entropy = 0, 0.0, 0.0, 0.0, 0.0
            for mb in micro_batches(sub, MICRO_BATCH):
                w = mb.loss_mask.shape[1]
                rows = idx[row : row + mb.size]
                mb_mask = m[rows, :w]
                share = _units(mb_mask, cfg.aggregation) / total
                routing = mb_routing(model, mb, True) if replay else None
                if single:  # the no-grad pass would have recorded the trainer's routing: this pass does
                    routing = mb_routing(model, mb, False)
                    recorded.append(routing)
                scored = score(model, mb.input_ids, mb.attention_mask, entropy_grad=cfg.entropy_coef > 0,
                               value_head=value_head if value_cfg is not None else None, routing=routing)  # fmt: skip
                if single:  # ``old_logp`` is ``trainer_old`` detached: the ratio of this pass is exactly 1
                    trainer_old[rows, :w] = scored.logprobs.detach()
                mb_w = weights[rows, :w] if weights is not None else None
                out = policy_loss(cfg, scored.logprobs, old_logp[rows, :w], adv[rows, :w], mb_mask, mb_w, norm)
                loss = out.loss
                if cfg.kl.coef > 0 and cfg.kl.use == "loss":
                    kl_ref = ref_logp[rows, :w]
                    loss = loss + kl_loss(scored.logprobs, kl_ref, mb_mask, cfg.kl.coef, cfg.kl.estimator,
                                          cfg.aggregation, norm)  # fmt: skip
                if cfg.entropy_coef > 0:
                    loss = loss + entropy_bonus(scored.entropy, mb_mask, cfg.entropy_coef, cfg.aggregation, norm)
                if value_cfg is not None and scored.values is not None and returns is not None:
                    clip = value_cfg.value_clip if isinstance(value_cfg, GAE) else None
                    v_out = value_loss(scored.values, old_values[rows, :w], returns[rows, :w],  # type: ignore[index]
                                       batch.loss_mask[rows, :w], clip, cfg.aggregation, norm)  # fmt: skip
                    loss = loss + value_cfg.value_coef * v_out.loss
                    sums["value_loss"] += float(v_out.loss.detach()) * float(share)
                (loss * share).backward()
                step_loss += float(loss.detach()) * float(share)
                with torch.no_grad():
                    if needs_ref:
                        kl_now = kl_estimate(scored.logprobs, ref_logp[rows, :w], "k3")
                        kl_live += float(masked_token_mean(kl_now, mb_mask)) * float(share)
                    step_entropy += float(masked_token_mean(scored.entropy.detach(), mb_mask)) * float(share)
                sums["clip"] += float(out.clip_fraction) * float(share)
                dev = max(dev, float(out.ratio_max_dev))
                row += mb.size
            if first_dev is None:
                first_dev = dev
            params = [p for g in optimizer.param_groups for p in g["params"]]
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm))
            norms.append(grad_norm)
            sums["loss"] += step_loss
            sums["entropy"] += step_entropy
            sums["kl_live"] = max(sums["kl_live"], kl_live)
            tripped = trip_reason(cfg.guards, loss=step_loss, grad_norm=grad_norm,
                                  kl=kl_live if needs_ref else None, entropy=step_entropy)  # fmt: skip
            if tripped is not None:
                break
            optimizer.step()
        if tripped is not None:
            break
    if routed is None:
        routed = join_routing(recorded, batch.input_ids.shape[1])
    metrics = mismatch_metrics(trainer_old, batch.sampler_logprobs, batch.loss_mask, correction)
    metrics.update(routing_metrics(batch, routed, int(model.config.num_experts_per_tok)))
    if ref_model is not None and not needs_ref:
        head = batch.select(torch.arange(min(MICRO_BATCH, batch.size)))
        head_ref = _no_grad_pass(ref_model, head)[0]
        kl_head = kl_k3(trainer_old[: head.size], head_ref)
        metrics["train/kl_ref_k3"] = float(masked_token_mean(kl_head, head.loss_mask))
    else:
        metrics["train/kl_ref_k3"] = float(masked_token_mean(kl_k3(trainer_old, ref_logp), batch.loss_mask))
    steps = max(1, len(norms))
    mean_entropy = sums["entropy"] / steps
    if tripped is not None:
        if snapshot is not None:
            restore(snapshot, model, value_head, optimizer)
        metrics[f"guard/trip_{tripped}"] = 1.0
    metrics.update(
        {
            "guard/skipped": float(tripped is not None),
            "train/loss": sums["loss"] / steps,
            "train/clip_fraction": sums["clip"] / steps,
            "train/entropy": mean_entropy,
            "train/grad_norm": max(norms) if norms else 0.0,
            "train/ratio_max_dev_first_mb": first_dev or 0.0,
            "train/episodes": float(batch.size),
            "train/tokens": float(batch.loss_mask.sum()),
            "train/dropped_zero_var": float(prepared.n_dropped_zero_var),
            "train/masked_failures": float(prepared.n_failed),
        }
    )
    if value_cfg is not None:
        metrics["train/value_loss"] = sums["value_loss"] / steps
    if needs_ref:
        metrics["train/kl_ref_live_k3"] = sums["kl_live"]
    return metrics
