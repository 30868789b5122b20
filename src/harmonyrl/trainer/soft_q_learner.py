"""The off-policy, maximum-entropy learner (the SAC-style row): soft Q-learning over token actions.

Parametrisation. ``Q(s, a) = α · log π(a | s) + V(s)`` with ``π = softmax(logits)`` (the policy the engine
samples) and ``V`` a value head on the policy's last hidden state. Then the soft value
``α · logsumexp(Q / α)`` is exactly ``V(s)`` (π sums to 1), π is the Boltzmann policy of ``Q`` at
temperature α, and the soft Bellman residual on a sampled token reads
``α log π(a_t | s_t) + V(s_t) − (r_t + V(s_next))`` — path consistency. Why not raw logits as ``Q``: an LM's
per-state logit offset is arbitrary, and a TD loss on the taken logit alone would fight that offset by
reshaping the policy; the normalised ``log π`` plus an explicit ``V`` leaves nothing arbitrary.

Off-policy: Bellman targets hold for any behaviour policy, so updates draw episodes from a replay buffer
(this step's plus older ones). α is tuned towards a target entropy per token (SAC's automatic temperature).
Targets are semi-gradient (detached ``V(s_next)`` from the same forward pass; no target network — the
simplest sound choice at this scale).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from harmonyrl.algorithms.choices import SoftQ
from harmonyrl.algorithms.losses import masked_token_mean
from harmonyrl.algorithms.mismatch import mismatch_metrics
from harmonyrl.algorithms.soft_q import (
    policy_entropy,
    soft_bellman_targets,
    soft_q_loss,
    soft_values,
    taken_q_values,
    temperature_loss,
)
from harmonyrl.config import RLConfig
from harmonyrl.models.grad_checkpointing import eval_mode
from harmonyrl.trainer.batch import collate, micro_batches, score
from harmonyrl.trainer.device import to_device
from harmonyrl.trainer.guards import restore, take_snapshot, trip_reason
from harmonyrl.trainer.replay_buffer import ReplayBuffer
from harmonyrl.trainer.update_result import UpdateResult
from harmonyrl.types import Trajectory

MICRO_BATCH = 32


@dataclass
class SoftQState:
    """What the soft-Q learner carries across RL steps besides the model and its optimizer."""

    cfg: SoftQ
    replay: ReplayBuffer
    log_alpha: torch.Tensor
    alpha_optimizer: torch.optim.Optimizer

    @staticmethod
    def create(cfg: SoftQ, replay: ReplayBuffer) -> SoftQState:
        log_alpha = torch.tensor(float(torch.tensor(cfg.alpha).log()), requires_grad=True)
        return SoftQState(cfg, replay, log_alpha, torch.optim.Adam([log_alpha], lr=cfg.alpha_lr))


def soft_q_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    value_head: torch.nn.Module,
    state: SoftQState,
    trajectories: Sequence[Trajectory],
    cfg: RLConfig,
    pad_id: int,
) -> UpdateResult:
    """Add this step's episodes to the buffer, then ``updates_per_step`` soft-Q updates on replayed batches
    (none when the buffer is empty; all rolled back when a guard trips)."""
    sq = state.cfg
    device = next(model.parameters()).device
    state.replay.add(trajectories)
    fresh = [t for t in trajectories if t.failure is None]
    metrics: dict[str, float] = {"replay/size": float(len(state.replay)), "train/masked_failures": 0.0}
    metrics["train/masked_failures"] = float(len(trajectories) - len(fresh))
    if fresh:  # the sampler/trainer gap on the newest (on-policy) episodes, as for every learner
        new = to_device(collate(fresh, pad_id), device)
        with torch.no_grad():
            logp = torch.cat([_pad(score(model, mb.input_ids, mb.attention_mask).logprobs, new.loss_mask.shape[1])
                              for mb in micro_batches(new, MICRO_BATCH)])  # fmt: skip
        metrics |= mismatch_metrics(logp, new.sampler_logprobs, new.loss_mask)
    if not len(state.replay):
        return UpdateResult(metrics | {"train/skipped": 1.0}, "nothing_trainable")
    # guards check each update before it is applied; only a later update's trip must undo earlier ones
    snapshot = take_snapshot(model, value_head, optimizer) if sq.updates_per_step > 1 else None
    sums = {"loss": 0.0, "td": 0.0, "q": 0.0, "target": 0.0, "entropy": 0.0}
    norms, tripped = [], None
    eval_mode(model)
    for _ in range(sq.updates_per_step):
        batch = to_device(collate(state.replay.sample(min(sq.replay_batch, len(state.replay))), pad_id), device)
        alpha = state.log_alpha.exp().detach()
        total = batch.loss_mask.sum().clamp(min=1.0)
        optimizer.zero_grad(set_to_none=True)
        state.alpha_optimizer.zero_grad(set_to_none=True)
        step_loss, step_entropy = 0.0, 0.0
        for mb in micro_batches(batch, MICRO_BATCH):
            scored = score(model, mb.input_ids, mb.attention_mask, value_head=_Detached(value_head), keep_logits=True)
            assert scored.logits is not None and scored.values is not None
            log_pi = torch.log_softmax(scored.logits.float(), dim=-1)
            q = alpha * log_pi + scored.values[..., None]  # [b, t, V]: soft Q of every token
            with torch.no_grad():
                v_soft = soft_values(q, alpha)  # == values (π sums to 1), computed the library's way
                entropy = policy_entropy(q, alpha)
            targets = soft_bellman_targets(mb.rewards, v_soft, mb.loss_mask)
            out = soft_q_loss(taken_q_values(q, mb.input_ids[:, 1:]), targets, mb.loss_mask, cfg.aggregation,
                              td_loss="huber" if sq.huber else "squared")  # fmt: skip
            share = mb.loss_mask.sum() / total
            (out.loss * share).backward()
            if sq.target_entropy is not None:
                (temperature_loss(state.log_alpha, entropy, mb.loss_mask, sq.target_entropy) * share).backward()
            step_loss += float(out.loss.detach()) * float(share)
            for key, value in (("td", out.td_error_abs_mean), ("q", out.q_mean), ("target", out.target_mean)):
                sums[key] += float(value) * float(share)
            step_entropy += float(masked_token_mean(entropy, mb.loss_mask)) * float(share)
        params = [p for g in optimizer.param_groups for p in g["params"]]
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm))
        norms.append(grad_norm)
        sums["loss"] += step_loss
        sums["entropy"] += step_entropy
        tripped = trip_reason(cfg.guards, loss=step_loss, grad_norm=grad_norm, entropy=step_entropy)
        if tripped is not None:
            break
        optimizer.step()
        if sq.target_entropy is not None:
            state.alpha_optimizer.step()
    n = max(1, len(norms))
    if tripped is not None:
        if snapshot is not None:
            restore(snapshot, model, value_head, optimizer)
        metrics[f"guard/trip_{tripped}"] = 1.0
    metrics |= {
        "train/skipped": 0.0,
        "guard/skipped": float(tripped is not None),
        "train/loss": sums["loss"] / n,
        "train/td_error": sums["td"] / n,
        "train/q_mean": sums["q"] / n,
        "train/target_mean": sums["target"] / n,
        "train/entropy": sums["entropy"] / n,
        "train/alpha": float(state.log_alpha.detach().exp()),
        "train/grad_norm": max(norms) if norms else 0.0,
        "train/episodes": float(len(fresh)),
    }
    return UpdateResult(metrics, None if tripped is None else "guard")


class _Detached(torch.nn.Module):
    """The value head on *detached* trunk features. The TD error reaches the trunk through V with weight 1
    but through α·log π only with weight α, so a shared-trunk V let value regression overwrite the language
    model (measured: held-out 32 % → 0 % with parse errors at 100 % within 16 steps, even at α = 0.005).
    Detached, the trunk learns only from the policy term; the head fits V on its own."""

    def __init__(self, head: torch.nn.Module) -> None:
        super().__init__()
        self.head = head

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        value: torch.Tensor = self.head(hidden.detach())
        return value


def _pad(x: torch.Tensor, width: int) -> torch.Tensor:
    """Right-pad ``[b, w]`` with zeros to ``[b, width]`` (micro-batches are trimmed to their own longest row)."""
    return torch.nn.functional.pad(x, (0, width - x.shape[1]))
