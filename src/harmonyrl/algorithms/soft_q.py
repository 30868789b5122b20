"""Token-level soft Q-learning (discrete SAC with a Boltzmann actor): pure functions, shapes in docstrings.

``B`` episodes, ``T`` padded length, ``V`` vocabulary. Per-token tensors follow the repo's shifted convention:
``[B, T-1]`` with index ``t`` referring to the target token ``input_ids[:, t + 1]``; ``logits`` is
``[B, T-1, V]`` (the LM head output at the position that predicts that token). ``mask`` is the loss mask.

Why the logits are the soft Q-values. An LM samples a token with probability ``softmax(logits / α)``. A
maximum-entropy agent's optimal policy has exactly that form, ``π(a|s) ∝ exp(Q(s, a) / α)``, with ``Q`` the
soft Q-function. Reading the logits as ``Q`` therefore makes the one network both critic and actor: there is
no separate Q head, and no actor loss — SAC's actor step (move π toward ``exp(Q / α) / Z``) is exact by
construction, so improving ``Q`` improves the policy. At ``α = 1`` the initial actor is the pretrained LM
itself. One caveat: softmax ignores a per-state offset of the logits, soft values do not
(``V = α · logsumexp(Q / α)`` shifts with it), so the TD loss also has to pin that offset; a pretrained LM's
offsets are arbitrary, which shows as large TD errors on the first updates.

Why ``V`` of the next *sampled* position. The state after action ``a_t`` is the prefix up to and including
``a_t``, but if a tool call ended the message, the environment then appends tool output (mask 0) before the
policy acts again (plus the template's headers). Those tokens are the transition, not decisions, so the
next state where the policy decides — and whose soft value the target needs — is the next masked position:
``target_t = r_t + γ · V(s_next(t))``, with ``V`` read from the logits there (their prefix includes the tool
output). :func:`next_sampled_index` finds it.

Why the reward sits on the last sampled token, without bootstrap. Rewards are outcome rewards: the episode
ends after its last sampled token (truncated episodes included — the env scored them and nothing follows),
so that token's target is the reward itself and ``V`` of whatever follows (padding) must never leak in.

Gradient flow. Gradients reach the network only through ``q_taken`` (the logits of the sampled tokens) in
:func:`soft_q_loss`; targets are detached (semi-gradient TD, whether ``next_values`` come from a target
network or the same forward pass). :func:`temperature_loss` differentiates only ``log_alpha``; its entropy
input is detached. Pass ``α`` detached (a float or ``log_alpha.exp().detach()``) to the value functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from harmonyrl.algorithms.losses import AggregationMode, aggregate_loss, masked_token_mean

TDLoss = Literal["squared", "huber"]


def _check_alpha(alpha: float | torch.Tensor) -> None:
    value = float(alpha.detach()) if isinstance(alpha, torch.Tensor) else float(alpha)
    if value <= 0.0:
        raise ValueError(f"alpha must be > 0, got {value}")


def soft_values(logits: torch.Tensor, alpha: float | torch.Tensor) -> torch.Tensor:
    """Soft state values ``V(s_t) = α · logsumexp_a(Q(s_t, a) / α)``: ``[B, T-1, V]`` → ``[B, T-1]``.

    ``V = E_π[Q - α log π]``: the expected Q of the Boltzmann policy plus α times its entropy. As α → 0 it
    tends to ``max_a Q`` (hard Q-learning). Example: Q = [0, ln 3], α = 1 → ln(1 + 3) = ln 4.
    """
    _check_alpha(alpha)
    return alpha * torch.logsumexp(logits / alpha, dim=-1)


def policy_entropy(logits: torch.Tensor, alpha: float | torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of the Boltzmann policy ``softmax(Q / α)``: ``[B, T-1, V]`` → ``[B, T-1]``.

    Not detached (usable as a metric or a bonus); detach it before :func:`temperature_loss`.
    Example: Q = [0, ln 3], α = 1 → π = [1/4, 3/4], H = ln 4 - (3/4) ln 3.
    """
    _check_alpha(alpha)
    logp = F.log_softmax(logits / alpha, dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


def taken_q_values(logits: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """``Q(s_t, a_t)``: gather ``[B, T-1, V]`` logits at ``[B, T-1]`` token ids (``input_ids[:, 1:]``) → ``[B, T-1]``.

    Keeps the gradient: this is the tensor :func:`soft_q_loss` differentiates.
    """
    return logits.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)


def next_sampled_index(mask: torch.Tensor) -> torch.Tensor:
    """Index of the next masked position in the same row: ``[B, T-1]`` mask → ``[B, T-1]`` long.

    For masked ``t``: ``min{t' > t : mask[t'] = 1}``, or ``-1`` if ``t`` is the row's last masked position
    (the terminal action). Unmasked positions also get ``-1`` (they are not actions).
    Example: mask [0, 1, 1, 0, 0, 1, 0] (prompt, two tokens, tool output, one token, padding) →
    [-1, 2, 5, -1, -1, -1, -1].
    """
    m = mask.bool()
    width = m.shape[-1]
    pos = torch.arange(width, device=m.device).expand_as(m)
    cand = torch.where(m, pos, torch.full_like(pos, width))
    # suffix_min[t] = first masked position ≥ t; the next one after t is suffix_min[t + 1]
    suffix_min = torch.flip(torch.cummin(torch.flip(cand, dims=[-1]), dim=-1).values, dims=[-1])
    after = torch.cat([suffix_min[..., 1:], torch.full_like(suffix_min[..., :1], width)], dim=-1)
    return torch.where(m & (after < width), after, torch.full_like(after, -1))


def soft_bellman_targets(
    rewards: torch.Tensor,
    next_values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 1.0,
    token_rewards: torch.Tensor | None = None,
) -> torch.Tensor:
    """Soft Bellman targets for the sampled tokens → ``[B, T-1]`` (detached).

    Args:
        rewards: ``[B]`` outcome rewards, earned at each row's last masked position (terminal: no bootstrap).
        next_values: ``[B, T-1]`` soft values ``V(s_t)`` (:func:`soft_values`) from a target network or the
            same forward pass; detached here. Only values at masked positions are ever read.
        mask: ``[B, T-1]`` loss mask.
        token_rewards: optional ``[B, T-1]`` dense rewards (shaping) added at masked positions.
    ``target_t = r_t + γ · V(s_next(t))`` for a masked ``t`` with a next masked position, ``r_t + reward`` at the
    row's last masked position, 0 where mask is 0 (an all-zero row is all zero).
    Example: mask [1, 1, 1], V = [0.2, 0.5, 0.9], reward 1, γ = 0.9 → [0.9·0.5, 0.9·0.9, 1] = [0.45, 0.81, 1].
    """
    if rewards.dim() != 1 or next_values.shape != mask.shape or rewards.shape[0] != mask.shape[0]:
        raise ValueError(
            f"rewards {tuple(rewards.shape)} must be [B]; next_values and mask [B, T-1], got "
            f"{tuple(next_values.shape)} and {tuple(mask.shape)}"
        )
    m = mask.bool()
    v = next_values.detach()
    nxt = next_sampled_index(mask)
    v_next = v.gather(-1, nxt.clamp(min=0))
    targets = torch.where(nxt >= 0, gamma * v_next, rewards.detach().to(v.dtype)[:, None].expand_as(v))
    if token_rewards is not None:
        targets = targets + token_rewards.detach().to(v.dtype)
    return torch.where(m, targets, torch.zeros_like(targets))


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

    Per token, with ``δ = Q(s_t, a_t) - sg[target_t]``: ``½ δ²`` ("squared") or Huber
    ``½ δ²`` for ``|δ| ≤ d``, ``d (|δ| - ½ d)`` beyond ("huber": bounded gradient, robust to the large early
    errors of a pretrained LM's logits); reduced with :func:`aggregate_loss`.
    Example: Q = [0.5, 3], targets [1, 1] → δ = [-0.5, 2]; squared token-mean (0.125 + 2) / 2 = 1.0625,
    Huber (d = 1) (0.125 + 1.5) / 2 = 0.8125.
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


def temperature_loss(
    log_alpha: torch.Tensor, entropy: torch.Tensor, mask: torch.Tensor, target_entropy: float
) -> torch.Tensor:
    """SAC automatic entropy tuning: ``-log α · (H_target - sg[H])``, token-mean over masked tokens → scalar.

    Args:
        log_alpha: scalar tensor (the learnable parameter; α = exp(log α) stays positive).
        entropy: ``[B, T-1]`` policy entropy (:func:`policy_entropy`); detached here.
        mask: ``[B, T-1]`` loss mask.
    ``d loss / d log α = mean(H) - H_target``: negative when the policy is less random than the target, so
    gradient descent raises α (flatter policy), and vice versa. An all-zero mask gives 0 and zero gradient.
    """
    if log_alpha.dim() != 0:
        raise ValueError(f"log_alpha must be a scalar tensor, got shape {tuple(log_alpha.shape)}")
    m = mask.bool()
    gap = torch.where(m, target_entropy - entropy.detach(), torch.zeros_like(entropy))
    return -log_alpha * masked_token_mean(gap, mask)
