"""One on-policy RL update (the PPO family) from a step's trajectories.

The order mirrors the data flow: filter → collate → no-grad passes (old log-probs and values, reference) →
rollout correction → token rewards (+ KL penalty) → advantages → epochs × minibatches of policy loss
(+ value loss, KL loss, entropy bonus) → stability guards → metrics. :func:`rl_update` reads as those steps:
:func:`~harmonyrl.rl.targets.old_policy` and :func:`~harmonyrl.rl.targets.loss_targets` (what the
update reads, in :mod:`harmonyrl.rl.targets`), ``_optimize`` (each ``_optimizer_step`` runs ``_micro_batch``
forward/loss/backward; each returns its figures, :mod:`harmonyrl.rl.figures`), ``_metrics``; it returns an
:class:`~harmonyrl.learn.update_result.UpdateResult` saying whether the update was applied.

When the update is a single pass that nothing before the loss reads old log-probs for (``single_pass``,
the default config), that pass supplies them and the no-grad pass is skipped. The first pass also records the
MoE routing (``routing/*`` metrics); with ``routing_replay`` r2 / r3 every pass routes by a fixed record
(:mod:`harmonyrl.rl.routing_replay`). The math lives in :mod:`harmonyrl.algorithms`; which function runs
is chosen by ``match`` on the typed choices in ``RLConfig``. The off-policy soft-Q row has its own update in
:mod:`harmonyrl.rl.soft_q`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from transformers import GptOssForCausalLM

from harmonyrl.algorithms.advantages import (
    value_loss,
)
from harmonyrl.algorithms.choices import (
    A2C,
    GAE,
    GSPOLoss,
    PolicyGradient,
    PPOClip,
)
from harmonyrl.algorithms.distill import full_reverse_kl
from harmonyrl.algorithms.kl import kl_estimate, kl_k3, kl_loss
from harmonyrl.algorithms.losses import (
    AggregationMode,
    PolicyLossOutput,
    aggregate_loss,
    aggregation_units,
    entropy_bonus,
    gspo_loss,
    masked_token_mean,
    policy_gradient_loss,
    ppo_clip_loss,
)
from harmonyrl.algorithms.mismatch import mismatch_metrics
from harmonyrl.algorithms.staleness import staleness_lr_scale
from harmonyrl.config import RLConfig
from harmonyrl.distributed.world import SINGLE, World, broadcast, most_rows, shard_rows, sum_all
from harmonyrl.learn.batch import Batch, Scored, micro_batches, score
from harmonyrl.learn.guards import restore, take_snapshot
from harmonyrl.learn.optimizer_step import GuardFigures, optimizer_step, scaled_lr
from harmonyrl.learn.update_result import UpdateResult
from harmonyrl.models.grad_checkpointing import eval_mode
from harmonyrl.models.moe_routing import NOT_ROUTED, MoeRouting
from harmonyrl.rl.figures import Micro, StepFigures, UpdateFigures, over_ranks
from harmonyrl.rl.reference import Reference
from harmonyrl.rl.routing_replay import TrainerRouting, join_routing, mb_routing, routing_metrics
from harmonyrl.rl.targets import (
    LossTargets,
    OldPolicy,
    Prepared,
    loss_targets,
    no_grad_pass,
    old_policy,
)


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


@dataclass(frozen=True)
class _Pass:
    """What every optimizer step of one update reads."""

    cfg: RLConfig
    batch: Batch
    """The batch as the update's passes route it (under R2: by the first pass's record)."""
    old: OldPolicy
    targets: LossTargets
    critic: torch.nn.Module | None
    norm: float | None
    needs_ref: bool
    world: World = SINGLE
    """Under torchrun: this rank trains its shard of each minibatch's rows (see ``_optimizer_step``)."""
    teacher: torch.nn.Module | None = None
    """``rl.distill.kind=full``: the teacher whose whole distribution each micro-batch's loss is pulled toward."""


def rl_update(
    model: GptOssForCausalLM,
    optimizer: torch.optim.Optimizer,
    prepared: Prepared,
    cfg: RLConfig,
    ref_model: Reference | None,
    value_head: torch.nn.Module | None = None,
    norm: float | None = None,
    world: World = SINGLE,
    teacher: torch.nn.Module | None = None,
) -> UpdateResult:
    """Apply ``cfg.epochs × cfg.minibatches`` optimizer steps, or none if a guard trips (then everything is
    rolled back and the result is not ``applied``).

    ``value_head`` is required by critic estimators (its parameters must be in ``optimizer``); ``norm`` is the
    constant of ``seq-mean-token-sum-norm`` (the episode token budget); ``teacher`` is required by
    ``rl.distill.kind=full`` (a no-grad pass of it per micro-batch gives the logits the loss term reads).

    Under torchrun (``world``) every rank holds the whole batch: the no-grad passes, advantages and loss
    targets are computed over all of it (identically on every rank), and only the gradient passes are split:
    each rank takes its rows of every minibatch, weighted by the minibatch's global normaliser, and FSDP sums
    the gradients. The figures the guards read are summed (or maxed) over the ranks before they decide.
    """
    batch = prepared.batch
    # a guard checks each optimizer step before it is applied; only a later step's trip must undo earlier ones
    planned = cfg.epochs * min(cfg.minibatches, batch.size)
    snapshot = take_snapshot(model, value_head, optimizer) if planned > 1 else None
    eval_mode(model)  # no dropout: old and new log-probs must come from the same function (checkpointing stays on)
    critic = value_head if isinstance(cfg.advantage, GAE | A2C) else None
    old = old_policy(model, batch, cfg, critic, world)
    # KL to the reference: every token when it is trained on or guarded; else a one-micro-batch estimate
    # for the metric (a full reference pass would cost a fifth of the update).
    needs_ref = ref_model is not None and (cfg.kl.coef > 0 or cfg.guards.max_kl is not None)
    ref_logp = _reference_logp(ref_model, batch, cfg.micro_batch) if needs_ref and ref_model is not None else old.logp
    targets = loss_targets(cfg, batch, old, ref_logp)
    train_batch = batch
    full = cfg.distill is not None and cfg.distill.kind == "full"
    if full and teacher is None:
        raise ValueError("rl.distill.kind=full needs the teacher model passed to rl_update")
    if cfg.routing_replay == "r2":  # every later pass of this step routes as the first did (R3: as the sampler)
        assert old.routing is not None, "single_pass() is never chosen under R2"
        train_batch = replace(batch, routing=old.routing.used)
    # async: a smaller step for a gradient taken on stale samples (the bound k: replay reads only the config)
    scale = staleness_lr_scale(cfg.async_.max_staleness, cfg.async_.lr_decay)
    with scaled_lr(optimizer, scale):
        plan = _Pass(cfg, train_batch, old, targets, critic, norm, needs_ref, world, teacher if full else None)
        steps = _optimize(model, optimizer, plan)
    figures = UpdateFigures.of(steps, world)
    if old.single:  # each rank's pass filled in its rows (zeros elsewhere): the whole batch's, on every rank
        sum_all(old.logp, world)
    if figures.tripped is not None and snapshot is not None:
        restore(snapshot, model, value_head, optimizer)
    metrics = _metrics(model, prepared, cfg, ref_model, old, targets, figures, needs_ref, world)
    if cfg.async_.enabled:  # k = 0 keeps today's keys
        metrics["async/lr_scale"] = scale
    return UpdateResult(metrics, None if figures.tripped is None else "guard")


def _optimize(model: torch.nn.Module, optimizer: torch.optim.Optimizer, p: _Pass) -> list[StepFigures]:
    """Epochs × minibatches optimizer steps; stops at the first step a guard trips (that step not applied)."""
    order = torch.arange(p.batch.size)
    n_mb = min(p.cfg.minibatches, p.batch.size)
    steps: list[StepFigures] = []
    for _ in range(p.cfg.epochs):
        for idx in torch.tensor_split(order, n_mb):
            steps.append(_optimizer_step(model, optimizer, p, idx))
            if steps[-1].tripped is not None:
                return steps
    return steps


def _optimizer_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, p: _Pass, idx: torch.Tensor
) -> StepFigures:
    """One minibatch (rows ``idx``): gradients over its micro-batches, clipping, the guards, then the step.

    Under torchrun this rank takes its shard of ``idx``; ``total``, the minibatch's global normaliser, counts
    every rank's rows. Every rank runs the same number of forward/backward passes (FSDP's collectives pair
    up), a rank short of rows running zero-weighted ones (``_idle_pass``)."""
    cfg = p.cfg
    total = aggregation_units(p.targets.mask[idx], cfg.aggregation).clamp(min=1.0)
    tokens = p.targets.mask[idx].sum().clamp(min=1.0)
    micro: list[Micro] = []
    summed: list[tuple[float, float, float, float]] = []  # (loss, kl_live, entropy, dev) over the ranks

    def backward() -> GuardFigures:
        row, mine = 0, idx[shard_rows(len(idx), p.world)]
        parts = list(micro_batches(p.batch.select(mine), cfg.micro_batch)) if len(mine) else []
        for mb in parts:
            micro.append(_micro_batch(model, p, mb, mine[row : row + mb.size], (total, tokens)))
            row += mb.size
        for _ in range(-(-most_rows(len(idx), p.world) // cfg.micro_batch) - len(parts)):
            _idle_pass(model, p, idx[:1])
        summed.append(over_ranks(micro, p.world))
        loss, kl_live, entropy, _ = summed[0]
        return GuardFigures(loss, kl_live if p.needs_ref else None, entropy)

    params = [q for g in optimizer.param_groups for q in g["params"]]
    outcome = optimizer_step(optimizer, params, backward, cfg.max_grad_norm, cfg.guards, cfg.lr_warmup_steps)
    return StepFigures(tuple(micro), *summed[0], outcome.grad_norm, outcome.tripped)


def _micro_batch(
    model: torch.nn.Module, p: _Pass, mb: Batch, rows: torch.Tensor, totals: tuple[torch.Tensor, torch.Tensor]
) -> Micro:
    """Forward, loss and backward of one micro-batch (batch rows ``rows``), weighted by its share of the
    minibatch's units; its contributions to the step's figures. ``totals``: the minibatch's units (the loss's
    global normaliser) and its tokens (the per-token figures': entropy, KL, clip fraction)."""
    w = mb.loss_mask.shape[1]
    mb_mask = p.targets.mask[rows, :w]
    share = aggregation_units(mb_mask, p.cfg.aggregation) / totals[0]
    token_share = float(mb_mask.sum() / totals[1])
    scored, routing = _forward(model, p, mb, rows)
    out, loss, v_loss = _mb_loss(p, scored, rows, mb_mask)
    distill_kl = 0.0
    if p.teacher is not None and p.cfg.distill is not None:  # rl.distill.kind=full: the exact reverse KL, a loss
        assert scored.logits is not None, "the full distillation term keeps the micro-batch's logits"
        with torch.no_grad():
            teacher_logits = score(p.teacher, mb.input_ids, mb.attention_mask, keep_logits=True).logits
        assert teacher_logits is not None
        kl = full_reverse_kl(scored.logits, teacher_logits)  # [b, t-1]
        loss = loss + p.cfg.distill.weight * aggregate_loss(kl, mb_mask, p.cfg.aggregation, p.norm)
        distill_kl = float(masked_token_mean(kl.detach(), mb_mask)) * token_share
    with torch.autocast(loss.device.type, enabled=False):  # under bf16 autocast: the forward only
        (loss * share).backward()
    with torch.no_grad():
        kl_live = 0.0
        if p.needs_ref:
            kl_now = kl_estimate(scored.logprobs, p.targets.ref_logp[rows, :w], "k3")
            kl_live = float(masked_token_mean(kl_now, mb_mask)) * token_share
        entropy = float(masked_token_mean(scored.entropy.detach(), mb_mask)) * token_share
    return Micro(
        loss=float(loss.detach()) * float(share),
        kl_live=kl_live,
        entropy=entropy,
        clip=float(out.clip_fraction) * token_share,
        value_loss=float(v_loss.detach()) * float(share) if v_loss is not None else 0.0,
        dev=float(out.ratio_max_dev),
        routing=routing,
        distill_kl=distill_kl,
    )


def _idle_pass(model: torch.nn.Module, p: _Pass, rows: torch.Tensor) -> None:
    """A zero-weighted forward/backward on ``rows``, for a rank with fewer micro-batches than the busiest:
    its FSDP all-gathers and gradient reductions pair up with the other ranks' passes; it adds nothing."""
    mb = next(micro_batches(p.batch.select(rows), p.cfg.micro_batch))
    scored = score(model, mb.input_ids, mb.attention_mask, share_prefix=False)
    (scored.logprobs.sum() * 0.0).backward()


def _forward(model: torch.nn.Module, p: _Pass, mb: Batch, rows: torch.Tensor) -> tuple[Scored, MoeRouting | None]:
    """Score a micro-batch with gradients, routed as configured. The single pass also returns the routing it
    recorded and fills in the old log-probs of its rows (``old_logp`` is them, detached: its ratio is exactly 1;
    they are the no-grad pass's output, which this pass stands in for)."""
    routing = mb_routing(model, mb, True) if p.cfg.routing_replay != "none" else None
    if p.old.single:  # the no-grad pass would have recorded the trainer's routing: this pass does
        routing = mb_routing(model, mb, False)
    scored = score(model, mb.input_ids, mb.attention_mask, entropy_grad=p.cfg.entropy_coef > 0,
                   value_head=p.critic, routing=routing, needed=mb.loss_mask,
                   share_prefix=not p.world.distributed, keep_logits=p.teacher is not None)  # fmt: skip
    if not p.old.single:
        return scored, None
    p.old.logp[rows, : mb.loss_mask.shape[1]] = scored.logprobs.detach()
    return scored, routing


def _mb_loss(
    p: _Pass, scored: Scored, rows: torch.Tensor, mb_mask: torch.Tensor
) -> tuple[PolicyLossOutput, torch.Tensor, torch.Tensor | None]:
    """The policy loss, plus KL loss, entropy bonus and value loss as configured; and the value loss alone."""
    cfg, t, w = p.cfg, p.targets, mb_mask.shape[1]
    mb_w = t.weights[rows, :w] if t.weights is not None else None
    out = policy_loss(cfg, scored.logprobs, t.old_logp[rows, :w], t.adv[rows, :w], mb_mask, mb_w, p.norm)
    loss = out.loss
    if cfg.kl.coef > 0 and cfg.kl.use == "loss":
        loss = loss + kl_loss(scored.logprobs, t.ref_logp[rows, :w], mb_mask, cfg.kl.coef, cfg.kl.estimator,
                              cfg.aggregation, p.norm)  # fmt: skip
    if cfg.entropy_coef > 0:
        loss = loss + entropy_bonus(scored.entropy, mb_mask, cfg.entropy_coef, cfg.aggregation, p.norm)
    value_cfg = cfg.advantage if isinstance(cfg.advantage, GAE | A2C) else None
    if value_cfg is None or scored.values is None or t.returns is None:
        return out, loss, None
    assert p.old.values is not None, "critic estimators always run the no-grad pass"
    clip = value_cfg.value_clip if isinstance(value_cfg, GAE) else None
    v_out = value_loss(scored.values, p.old.values[rows, :w], t.returns[rows, :w], p.batch.loss_mask[rows, :w],
                       clip, cfg.aggregation, p.norm)  # fmt: skip
    return out, loss + value_cfg.value_coef * v_out.loss, v_out.loss


def _metrics(
    model: GptOssForCausalLM,
    prepared: Prepared,
    cfg: RLConfig,
    ref_model: Reference | None,
    old: OldPolicy,
    targets: LossTargets,
    figures: UpdateFigures,
    needs_ref: bool,
    world: World = SINGLE,
) -> dict[str, float]:
    """The update's metrics: mismatch, routing, KL to the reference, guards, and the loss terms' means."""
    batch = prepared.batch
    routed = old.routing if old.routing is not None else _joined_routing(figures.recorded, batch, world)
    metrics = mismatch_metrics(old.logp, batch.sampler_logprobs, batch.loss_mask, targets.correction)
    metrics.update(routing_metrics(batch, routed, int(model.config.num_experts_per_tok)))
    kl = _kl_to_reference(batch, old.logp, targets.ref_logp, ref_model, needs_ref, cfg.micro_batch)
    metrics["train/kl_ref_k3"] = kl
    if figures.tripped is not None:
        metrics[f"guard/trip_{figures.tripped}"] = 1.0
    steps = max(1, len(figures.steps))
    loss = entropy = kl_live = 0.0
    for step in figures.steps:
        loss += step.loss
        entropy += step.entropy
        kl_live = max(kl_live, step.kl_live)
    metrics.update(
        {
            "guard/skipped": float(figures.tripped is not None),
            "train/loss": loss / steps,
            "train/clip_fraction": figures.clip / steps,
            "train/entropy": entropy / steps,
            "train/grad_norm": max(step.grad_norm for step in figures.steps) if figures.steps else 0.0,
            "train/ratio_max_dev_first_mb": figures.steps[0].dev if figures.steps else 0.0,
            "train/episodes": float(batch.size),
            "train/tokens": float(batch.loss_mask.sum()),
            "train/dropped_zero_var": float(prepared.n_dropped_zero_var),
            "train/masked_failures": float(prepared.n_failed),
        }
    )
    if isinstance(cfg.advantage, GAE | A2C):
        metrics["train/value_loss"] = figures.value_loss / steps
    if cfg.distill is not None and cfg.distill.kind == "full":  # the loss term's reverse KL, per token
        local = sum(m.distill_kl for step in figures.steps for m in step.micro)  # this rank's rows
        metrics["distill/full_reverse_kl"] = float(sum_all(torch.tensor([local]), world)) / steps
    if needs_ref:
        metrics["train/kl_ref_live_k3"] = kl_live
    return metrics


def _joined_routing(parts: list[MoeRouting], batch: Batch, world: World) -> TrainerRouting:
    """The single pass's per-micro-batch routing records over the whole batch. Under torchrun each rank recorded
    its own rows (:func:`shard_rows`, contiguous): each places them in a batch-sized grid offset by the padding
    value, the grids are summed over the ranks and the offset removed — exact, every cell comes from one rank."""
    width = batch.input_ids.shape[1]
    if not world.distributed:
        return join_routing(parts, width)
    mine = join_routing(parts, width) if parts else None
    shapes = broadcast(None if mine is None else (tuple(mine.own.shape[2:]), tuple(mine.logits.shape[2:])), world)
    rows = shard_rows(batch.size, world)

    def whole(local: torch.Tensor | None, grid: tuple[int, ...], fill: float, dtype: torch.dtype) -> torch.Tensor:
        out = torch.zeros((batch.size, width, *grid), dtype=dtype, device=batch.input_ids.device)
        if local is not None:
            out[rows] = local - fill
        return sum_all(out, world) + fill

    own = whole(None if mine is None else mine.own, shapes[0], NOT_ROUTED, torch.long)
    used = whole(None if mine is None else mine.used, shapes[0], NOT_ROUTED, torch.long)
    return TrainerRouting(own, used, whole(None if mine is None else mine.logits, shapes[1], 0.0, torch.float32))


def _kl_to_reference(
    batch: Batch,
    trainer_old: torch.Tensor,
    ref_logp: torch.Tensor,
    ref_model: Reference | None,
    needs_ref: bool,
    micro_batch: int,
) -> float:
    """k3 KL of the old policy to the reference: over the batch when the reference pass ran, else over the
    first micro-batch (a reference pass just for this metric)."""
    if ref_model is not None and not needs_ref:
        head = batch.select(torch.arange(min(micro_batch, batch.size)))
        head_ref = _reference_logp(ref_model, head, micro_batch)
        return float(masked_token_mean(kl_k3(trainer_old[: head.size], head_ref), head.loss_mask))
    return float(masked_token_mean(kl_k3(trainer_old, ref_logp), batch.loss_mask))


def _reference_logp(ref: Reference, batch: Batch, micro_batch: int) -> torch.Tensor:
    """``[B, T-1]`` log-probs of the reference policy (with LoRA: the policy's base, adapters switched)."""
    with ref.scoring() as module:
        return no_grad_pass(module, batch, micro_batch=micro_batch)[0]
