"""One RL policy update from a step's trajectories (GRPO advantages + PPO clipped objective).

The order mirrors the data flow: filter → advantages → collate → old/ref log-probs (no grad) →
epochs × minibatches of clipped-surrogate updates. The math lives in :mod:`harmonyrl.algorithms`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from harmonyrl.algorithms.advantages import broadcast_to_tokens, group_relative_advantages
from harmonyrl.algorithms.kl import kl_k3
from harmonyrl.algorithms.losses import entropy_bonus, masked_token_mean, ppo_clip_loss
from harmonyrl.algorithms.mismatch import mismatch_metrics
from harmonyrl.config import RLConfig
from harmonyrl.trainer.batch import Batch, collate, micro_batches, score
from harmonyrl.types import Trajectory

MICRO_BATCH = 16


@dataclass(frozen=True)
class Prepared:
    batch: Batch
    advantages: torch.Tensor
    """``[B]`` per-episode advantages of the kept episodes."""
    n_dropped_zero_var: int
    n_failed: int


def prepare(trajectories: Sequence[Trajectory], cfg: RLConfig, pad_id: int) -> Prepared | None:
    """Drop env failures (they never count as 0 in a group) and, optionally, zero-variance groups.

    Returns None when nothing trainable is left (e.g. every group solved or failed alike).
    """
    ok = [t for t in trajectories if t.failure is None]
    n_failed = len(trajectories) - len(ok)
    if not ok:
        return None
    rewards = torch.tensor([t.reward for t in ok], dtype=torch.float32)
    groups = torch.tensor([t.group_id for t in ok], dtype=torch.long)
    adv = group_relative_advantages(rewards, groups, std_normalize=cfg.std_normalize)
    keep = list(range(len(ok)))
    if cfg.skip_zero_variance_groups:
        keep = [i for i in keep if (rewards[groups == groups[i]] != rewards[i]).any()]
    if not keep:
        return None
    kept = [ok[i] for i in keep]
    return Prepared(collate(kept, pad_id), adv[keep], len(ok) - len(keep), n_failed)


@torch.no_grad()
def _logprobs(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """``[B, T-1]`` log-probs, computed with the same micro-batch slicing as the update (bit-exact)."""
    out = torch.zeros_like(batch.loss_mask)
    row = 0
    for mb in micro_batches(batch, MICRO_BATCH):
        lp = score(model, mb.input_ids, mb.attention_mask).logprobs
        out[row : row + mb.size, : lp.shape[1]] = lp
        row += mb.size
    return out


def rl_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    prepared: Prepared,
    cfg: RLConfig,
    ref_model: torch.nn.Module | None,
) -> dict[str, float]:
    """Apply ``cfg.epochs × cfg.minibatches`` optimizer steps; return metrics for this RL step."""
    batch = prepared.batch
    model.eval()  # no dropout: old and new log-probs must come from the same function
    old_logp = _logprobs(model, batch)
    ref_logp = _logprobs(ref_model, batch) if ref_model is not None else old_logp
    token_adv = broadcast_to_tokens(prepared.advantages, batch.loss_mask)
    m = batch.loss_mask
    metrics = mismatch_metrics(old_logp, batch.sampler_logprobs, m)
    metrics["train/kl_ref_k3"] = float(masked_token_mean(kl_k3(old_logp, ref_logp), m))
    order = torch.arange(batch.size)
    n_mb = min(cfg.minibatches, batch.size)
    losses, clips, ents, norms, first_dev = [], [], [], [], None
    for _ in range(cfg.epochs):
        for idx in torch.tensor_split(order, n_mb):
            total_tokens = m[idx].sum().clamp(min=1.0)
            optimizer.zero_grad(set_to_none=True)
            sub = batch.select(idx)
            sub_old, sub_ref, sub_adv = old_logp[idx], ref_logp[idx], token_adv[idx]
            row, dev = 0, 0.0
            for mb in micro_batches(sub, MICRO_BATCH):
                w = mb.loss_mask.shape[1]
                sl = slice(row, row + mb.size)
                scored = score(model, mb.input_ids, mb.attention_mask, entropy_grad=cfg.entropy_coef > 0)
                out = ppo_clip_loss(
                    scored.logprobs,
                    sub_old[sl, :w],
                    sub_adv[sl, :w],
                    mb.loss_mask,
                    cfg.clip_low,
                    cfg.clip_high,
                )
                share = mb.loss_mask.sum() / total_tokens
                loss = out.loss * share
                if cfg.kl_coef > 0:
                    loss = loss + cfg.kl_coef * share * masked_token_mean(
                        kl_k3(scored.logprobs, sub_ref[sl, :w]), mb.loss_mask
                    )
                if cfg.entropy_coef > 0:
                    loss = loss + share * entropy_bonus(scored.entropy, mb.loss_mask, cfg.entropy_coef)
                loss.backward()
                losses.append(float(loss.detach()))
                clips.append(float(out.clip_fraction) * float(share))
                ents.append(float(masked_token_mean(scored.entropy.detach(), mb.loss_mask)) * float(share))
                dev = max(dev, float(out.ratio_max_dev))
                row += mb.size
            if first_dev is None:
                first_dev = dev
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)))
            optimizer.step()
    steps = cfg.epochs * n_mb
    metrics.update(
        {
            "train/loss": sum(losses) / steps,
            "train/clip_fraction": sum(clips) / steps,
            "train/entropy": sum(ents) / steps,
            "train/grad_norm": max(norms),
            "train/ratio_max_dev_first_mb": first_dev or 0.0,
            "train/episodes": float(batch.size),
            "train/tokens": float(m.sum()),
            "train/dropped_zero_var": float(prepared.n_dropped_zero_var),
            "train/masked_failures": float(prepared.n_failed),
        }
    )
    return metrics
