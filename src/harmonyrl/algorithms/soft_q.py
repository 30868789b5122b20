"""KL-regularised soft Q-learning over token actions (the SAC-style row): pure functions, shapes in docstrings.

``B`` episodes, ``T`` padded length. Per-token tensors follow the repo's shifted convention: ``[B, T-1]`` with
index ``t`` referring to the target token ``input_ids[:, t + 1]``. ``mask`` is the loss mask (1 on the tokens
the policy sampled).

The objective. Maximum-entropy RL maximises ``r + α · Σ_t H(π(·|s_t))``. Over a language model's vocabulary its
optimum is noise: an episode of ``n`` tokens can earn up to ``α · n · log |V|`` nats of entropy bonus, which
outbids an outcome reward of 1 at any α that moves the policy (measured: entropy rose until the rollouts stopped
parsing, docs/sac.md). So the entropy is taken *relative to the warm start* π_ref:
``r − α · Σ_t KL(π(·|s_t) ‖ π_ref(·|s_t))``. Its optimal policy is ``π*(a|s) ∝ π_ref(a|s) · exp(Q*(s, a) / α)``
— the warm start, tilted towards the actions with a higher soft value — and a policy that does nothing but
babble is now *penalised*, not paid.

Parametrisation. ``Q(s, a) = α · ℓ(s, a) + V(s)`` with ``ℓ = log π(a|s) − log π_ref(a|s)``, ``π`` the actor (the
LM head: the policy the engine samples) and ``V`` the critic (a value head). The soft value
``α · log Σ_a π_ref · exp(Q / α)`` is then exactly ``V(s)``, and ``π`` is the optimal policy of ``Q``: SAC's
actor step is exact by construction. The soft Bellman residual of a sampled token is the path-consistency
residual ``δ_t = α ℓ_t + V(s_t) − y_t``: zero at the optimum along *any* path, so replayed (off-policy) episodes
are valid data.

Targets (:func:`soft_n_step_targets`): ``y_t = −α · Σ ℓ_j + V̄(s_b)`` over the sampled tokens ``j`` strictly
between ``t`` and ``b``, the ``horizon``-th sampled token after ``t``; ``V̄`` is the target (Polyak) value
network. Past the episode's last sampled token there is nothing to bootstrap from: the target is the outcome
reward itself. ``horizon=None`` never bootstraps (Monte Carlo soft return). Positions between sampled tokens
(tool output, message headers) are transitions, not decisions: they are skipped.

Gradient flow. :func:`soft_q_loss` differentiates ``q_taken = α ℓ_t + V(s_t)``: the critic gets ``δ``, the actor
``α · δ · ∇ log π(a_t|s_t)`` — at the start (π = π_ref, V = 0) that is ``−α · y_t · ∇ log π``, REINFORCE on the
outcome, which a learned ``V`` then turns into an advantage. Targets are detached (semi-gradient).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from harmonyrl.algorithms.losses import AggregationMode, aggregate_loss, masked_token_mean

TDLoss = Literal["squared", "huber"]


def log_ratio(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``ℓ_t = log π(a_t|s_t) − log π_ref(a_t|s_t)`` on sampled tokens, 0 elsewhere: ``[B, T-1]`` x2 → ``[B, T-1]``.

    Keeps the gradient of ``logprobs`` (the actor's); ``ref_logprobs`` is detached. Example: log-probs
    [-1, -2], reference [-1.5, -1], mask [1, 1] → [0.5, -1].
    """
    diff = logprobs - ref_logprobs.detach()
    return torch.where(mask.bool(), diff, torch.zeros_like(diff))


def kl_k3(ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimate of KL(π ‖ π_ref) per sampled token, token-mean: ``[B, T-1]`` ℓ → scalar (no grad).

    ``k3 = exp(−ℓ) − 1 + ℓ ≥ 0``. Example: ℓ = [0, ln 2] → [0, 1/2 − 1 + ln 2] → mean (ln 2 − 1/2) / 2.
    """
    with torch.no_grad():
        return masked_token_mean(torch.expm1(-ratio) + ratio, mask)


def nth_next_sampled_index(mask: torch.Tensor, n: int) -> torch.Tensor:
    """Position of the ``n``-th masked position after ``t``, per row: ``[B, T-1]`` mask → ``[B, T-1]`` long.

    For masked ``t``: the position of the ``n``-th masked ``t' > t``, or ``-1`` if the row has fewer than ``n``
    after ``t``. Unmasked positions get ``-1`` (they are not actions).
    Example: mask [0, 1, 1, 0, 0, 1, 0] (prompt, two tokens, tool output, one token, padding):
    n = 1 → [-1, 2, 5, -1, -1, -1, -1]; n = 2 → [-1, 5, -1, -1, -1, -1, -1].
    """
    if n < 1:
        raise ValueError(f"n must be ≥ 1, got {n}")
    m = mask.bool()
    rows, width = m.shape
    count = torch.cumsum(m.long(), dim=-1)  # the 1-based action number at a masked position
    table = torch.full((rows, width + n + 1), -1, dtype=torch.long, device=m.device)
    pos = torch.arange(width, device=m.device).expand_as(m)
    table.scatter_(1, torch.where(m, count, torch.zeros_like(count)), torch.where(m, pos, torch.full_like(pos, -1)))
    table[:, 0] = -1  # unmasked positions all scattered into column 0
    found = table.gather(1, torch.where(m, count + n, torch.zeros_like(count)))
    return torch.where(m, found, torch.full_like(found, -1))


def soft_n_step_targets(
    rewards: torch.Tensor,
    ratio: torch.Tensor,
    target_values: torch.Tensor,
    mask: torch.Tensor,
    alpha: float,
    horizon: int | None,
) -> torch.Tensor:
    """KL-regularised n-step soft Bellman targets for the sampled tokens → ``[B, T-1]`` (detached).

    Args:
        rewards: ``[B]`` outcome rewards, earned after each row's last masked position.
        ratio: ``[B, T-1]`` log-ratios ℓ (:func:`log_ratio`); detached here.
        target_values: ``[B, T-1]`` V̄(s_t) from the target value network; only read at bootstrap positions.
        mask: ``[B, T-1]`` loss mask.
        alpha: KL temperature α > 0.
        horizon: sampled tokens to look ahead before bootstrapping (≥ 1); ``None``: never (Monte Carlo).
    ``y_t = −α Σ_{t<j<b} ℓ_j + (V̄_b if b exists else reward)`` with ``b`` the ``horizon``-th next masked position;
    0 where mask is 0. Example: mask [1, 1, 1], ℓ = [0.1, 0.2, 0.4], α = 0.5, reward 1 — Monte Carlo:
    y = [1 − 0.5·0.6, 1 − 0.5·0.4, 1] = [0.7, 0.8, 1]; horizon 1 with V̄ = [9, 0.3, 0.6]: [0.3, 0.6, 1].
    """
    if rewards.dim() != 1 or ratio.shape != mask.shape or target_values.shape != mask.shape:
        raise ValueError(
            f"rewards {tuple(rewards.shape)} must be [B]; ratio, target_values and mask [B, T-1], got "
            f"{tuple(ratio.shape)}, {tuple(target_values.shape)} and {tuple(mask.shape)}"
        )
    if alpha <= 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    m = mask.bool()
    lm = torch.where(m, ratio.detach(), torch.zeros_like(ratio))
    suffix = torch.flip(torch.cumsum(torch.flip(lm, dims=[-1]), dim=-1), dims=[-1])  # Σ_{j ≥ t} ℓ_j
    after = suffix - lm  # Σ_{j > t} ℓ_j
    never = torch.full_like(mask, -1, dtype=torch.long)
    boot = never if horizon is None else nth_next_sampled_index(mask, horizon)
    has = boot >= 0
    at = boot.clamp(min=0)
    between = torch.where(has, after - suffix.gather(1, at), after)
    tail = torch.where(has, target_values.detach().gather(1, at), rewards.detach().to(lm.dtype)[:, None].expand_as(lm))
    return torch.where(m, tail - alpha * between, torch.zeros_like(lm))


@dataclass(frozen=True)
class SoftQOutput:
    loss: torch.Tensor
    """Scalar TD loss to minimise (gradient through ``q_taken`` only)."""
    td_error_abs_mean: torch.Tensor
    """Mean ``|Q - target|`` over masked tokens (no grad); watch it for divergence."""
    q_mean: torch.Tensor
    """Mean ``Q(s_t, a_t)`` over masked tokens (no grad)."""
    target_mean: torch.Tensor
    """Mean target over masked tokens (no grad)."""


def soft_q_loss(
    q_taken: torch.Tensor,
    targets: torch.Tensor,
    mask: torch.Tensor,
    aggregation: AggregationMode = "token-mean",
    *,
    td_loss: TDLoss = "squared",
    huber_delta: float = 1.0,
    norm: float | None = None,
) -> SoftQOutput:
    """Soft TD loss on the sampled tokens. ``[B, T-1]`` inputs → :class:`SoftQOutput`.

    ``q_taken`` is ``α ℓ_t + V(s_t)``. Per token, with ``δ = q_taken − sg[target]``: ``½ δ²`` ("squared") or
    Huber ``½ δ²`` for ``|δ| ≤ d``, ``d (|δ| − ½ d)`` beyond ("huber": bounded gradient); reduced with
    :func:`aggregate_loss`. Example: Q = [0.5, 3], targets [1, 1] → δ = [-0.5, 2]; squared token-mean
    (0.125 + 2) / 2 = 1.0625, Huber (d = 1) (0.125 + 1.5) / 2 = 0.8125.
    """
    m = mask.bool()
    delta = torch.where(m, q_taken - targets.detach(), torch.zeros_like(q_taken))
    if td_loss == "squared":
        per_token = 0.5 * delta**2
    elif td_loss == "huber":
        per_token = F.huber_loss(delta, torch.zeros_like(delta), reduction="none", delta=huber_delta)
    else:
        raise ValueError(f"unknown td_loss {td_loss!r}")
    with torch.no_grad():
        td_abs = masked_token_mean(delta.abs(), mask)
        q_mean = masked_token_mean(torch.where(m, q_taken, torch.zeros_like(q_taken)), mask)
        t_mean = masked_token_mean(torch.where(m, targets, torch.zeros_like(targets)), mask)
    return SoftQOutput(aggregate_loss(per_token, mask, aggregation, norm), td_abs, q_mean, t_mean)
