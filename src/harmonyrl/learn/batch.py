"""From trajectories to padded tensors, and scoring token ids with the trainer's model.

Position convention: logits at position ``t`` predict token ``t + 1``, so every per-token tensor here is
already shifted — index ``t`` refers to token ``ids[:, t + 1]``. Width is ``T - 1`` for padded length ``T``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from harmonyrl.learn.token_scores import LOGITS_BUDGET, chunk_positions, chunked_token_scores, token_scores
from harmonyrl.models import grad_checkpointing
from harmonyrl.models.compat import cache_kwarg, output_cache
from harmonyrl.models.moe_routing import NOT_ROUTED, MoeRouting
from harmonyrl.types import Trajectory


@dataclass(frozen=True)
class Batch:
    """Padded training batch. ``B`` episodes, ``T`` padded length.

    input_ids: ``[B, T]`` long; attention_mask: ``[B, T]`` (1 on real tokens);
    loss_mask, sampler_logprobs: ``[B, T-1]`` aligned with the *targets* ``input_ids[:, 1:]``;
    rewards: ``[B]``; group_ids: ``[B]`` long; routing: ``[B, T, L, k]`` the sampler's expert ids per
    position (``-1`` where not recorded or padded), None when no trajectory carries routing;
    teacher_logprobs: ``[B, T-1]`` a distillation teacher's log-probs of the targets (``rl.distill``), else None.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    sampler_logprobs: torch.Tensor
    rewards: torch.Tensor
    group_ids: torch.Tensor
    routing: torch.Tensor | None = None
    teacher_logprobs: torch.Tensor | None = None

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    def select(self, idx: torch.Tensor) -> Batch:
        return Batch(
            self.input_ids[idx],
            self.attention_mask[idx],
            self.loss_mask[idx],
            self.sampler_logprobs[idx],
            self.rewards[idx],
            self.group_ids[idx],
            routing=None if self.routing is None else self.routing[idx],
            teacher_logprobs=None if self.teacher_logprobs is None else self.teacher_logprobs[idx],
        )


def collate(trajectories: Sequence[Trajectory], pad_id: int) -> Batch:
    """Right-pad trajectories. Environment-failed episodes get an all-zero loss mask (never trained on)."""
    if not trajectories:
        raise ValueError("cannot build a batch from zero trajectories")
    width = max(len(t.token_ids) for t in trajectories)
    n = len(trajectories)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.float32)
    slp = torch.zeros((n, width), dtype=torch.float32)
    for i, t in enumerate(trajectories):
        k = len(t.token_ids)
        ids[i, :k] = torch.tensor(t.token_ids, dtype=torch.long)
        attn[i, :k] = 1
        if t.failure is None:
            mask[i, :k] = torch.tensor(t.loss_mask, dtype=torch.float32)
        slp[i, :k] = torch.tensor(t.sampler_logprobs, dtype=torch.float32)
    return Batch(
        input_ids=ids,
        attention_mask=attn,
        loss_mask=mask[:, 1:],
        sampler_logprobs=slp[:, 1:],
        rewards=torch.tensor([t.reward for t in trajectories], dtype=torch.float32),
        group_ids=torch.tensor([t.group_id for t in trajectories], dtype=torch.long),
        routing=_collate_routing(trajectories, width),
    )


def _collate_routing(trajectories: Sequence[Trajectory], width: int) -> torch.Tensor | None:
    """``[B, width, L, k]`` sampler routing padded with -1 (all -1 for a trajectory without any, e.g. one that
    never reached the engine), or None if no trajectory has routing."""
    parts = [t.routing.ids for t in trajectories if t.routing is not None]
    if not parts:
        return None
    if len({(tuple(p.shape[1:]), p.dtype) for p in parts}) != 1:
        raise ValueError("trajectories carry routing of different [L, k] shapes or dtypes")
    out = torch.full((len(trajectories), width, *parts[0].shape[1:]), NOT_ROUTED, dtype=parts[0].dtype)
    for i, t in enumerate(trajectories):
        if t.routing is None:
            continue
        ids = t.routing.ids
        if ids.shape[0] != len(t.token_ids):
            raise ValueError(f"trajectory {i} has routing for {ids.shape[0]} of its {len(t.token_ids)} tokens")
        out[i, : ids.shape[0]] = ids
    return out


@dataclass(frozen=True)
class Scored:
    logprobs: torch.Tensor
    """``[B, T-1]`` log-prob of each target token."""
    entropy: torch.Tensor
    """``[B, T-1]`` entropy of the predictive distribution (carries gradient only if asked for)."""
    values: torch.Tensor | None = None
    """``[B, T-1]`` value-head estimates V(s_t) at the positions that predict each target (critic only)."""
    logits: torch.Tensor | None = None
    """``[B, T-1, V]`` raw logits (soft Q-learning reads them as Q-values), only if asked for."""


MIN_SHARED_PREFIX = 16
"""Shortest common prefix worth a separate pass (below it the extra call costs more than it saves)."""


def shared_prefix_len(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> int:
    """Length of the token prefix every row of ``input_ids`` ``[B, T]`` has in common (all real tokens).

    In agentic RL every episode of an environment starts with the same system + developer messages (the
    tool declarations), typically most of a short episode's tokens.
    """
    same = (input_ids == input_ids[:1]).all(0) & attention_mask.bool().all(0)
    return int(same.long().cumprod(0).sum())


def _forward(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    hidden: bool = False,
    routing: MoeRouting | None = None,
    head: bool = True,
    share_prefix: bool = True,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``[B, T, V]`` logits (and ``[B, T, H]`` last hidden states if ``hidden``); a prefix shared by all rows
    is run once (batch 1) and its keys/values broadcast to every row. ``head=False``: no logits at all (None),
    only the final (normed) hidden states, for :func:`chunked_token_scores` to apply the LM head piece by piece.

    Exact: the prefix's activations are identical in every row, and autograd sums the rows' gradients
    through the broadcast (``expand``), as the per-row computation would. Falls back to one plain pass when
    the prefix is short or the model's cache is not the per-layer kind. Under ``routing`` (an entered
    :class:`MoeRouting`) each call names its part of the batch grid, and the shared prefix stops where the
    rows' replayed routing stops agreeing. ``share_prefix=False`` always makes the one plain pass (under FSDP
    every rank must call the model as often as the others, whatever its rows share).
    """
    b, t = input_ids.shape
    p = min(shared_prefix_len(input_ids, attention_mask), t - 1)
    if routing is not None:
        p = routing.shared_replay_len(p)
    everything = (slice(0, b), slice(0, t))
    head_win, tail_win = (slice(0, 1), slice(0, p)), (slice(0, b), slice(p, t))
    extra: dict[str, Any] = {"output_hidden_states": True} if hidden or not head else {}
    if not head:  # transformers' CausalLM forward applies the LM head to these positions only: none
        extra["logits_to_keep"] = torch.empty(0, dtype=torch.long)

    def last_hidden(out: Any) -> torch.Tensor | None:
        return out.hidden_states[-1] if hidden or not head else None

    # a checkpointed layer keeps no KV cache (transformers drops it), so the prefix could not be shared; a no-grad
    # pass of a checkpointed model does not share it either, so that it computes what the gradient pass computes
    if share_prefix and b >= 2 and p >= MIN_SHARED_PREFIX and not grad_checkpointing.enabled(model):
        with _window(routing, *head_win):
            first = model(input_ids=input_ids[:1, :p], use_cache=True, **extra)
        cache = output_cache(first)
        layers = getattr(cache, "layers", None)
        if layers is not None and all(hasattr(x, "keys") and hasattr(x, "values") for x in layers):
            for layer in layers:
                layer.keys = layer.keys.expand(b, -1, -1, -1)
                layer.values = layer.values.expand(b, -1, -1, -1)
            if routing is not None:
                routing.broadcast_rows(head_win[1])
            with _window(routing, *tail_win):
                tail = model(
                    input_ids=input_ids[:, p:],
                    attention_mask=attention_mask,
                    use_cache=True,
                    **{cache_kwarg(type(model).forward): cache},
                    **extra,
                )
            logits = torch.cat([first.logits.expand(b, -1, -1), tail.logits], dim=1) if head else None
            h_head, h_tail = last_hidden(first), last_hidden(tail)
            states = None if h_head is None or h_tail is None else torch.cat([h_head.expand(b, -1, -1), h_tail], 1)
            return logits, states
    with _window(routing, *everything):
        out = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **extra)
    return (out.logits if head else None), last_hidden(out)


def _window(routing: MoeRouting | None, rows: slice, cols: slice) -> AbstractContextManager[None]:
    return nullcontext() if routing is None else routing.window(rows, cols)


def _lm_head(model: torch.nn.Module) -> tuple[torch.nn.Module, int]:
    """The model's output projection (transformers' ``get_output_embeddings``, ``weight`` ``[V, H]``) and ``V``."""
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    weight = getattr(head, "weight", None)
    if not isinstance(head, torch.nn.Module) or not isinstance(weight, torch.Tensor):
        raise TypeError(f"{type(model).__name__} has no output embeddings (LM head) to score tokens with")
    return head, int(weight.shape[0])


def score(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    entropy_grad: bool = False,
    value_head: torch.nn.Module | None = None,
    keep_logits: bool = False,
    routing: MoeRouting | None = None,
    needed: torch.Tensor | None = None,
    share_prefix: bool = True,
) -> Scored:
    """Trainer log-probs of ``input_ids[:, 1:]`` given their prefixes (and values / logits if asked).

    A prefix common to all rows is computed once (see :func:`_forward`): ~2.3x faster on the calculator
    env, where the shared system + developer messages are 2/3 of every episode.
    The entropy is exact (summed over the vocabulary). It needs a gradient only for an entropy bonus: the
    sampled-token surprisal ``-logp`` would not do, since ``E[∇ log π] = 0`` makes its gradient vanish.
    ``routing``: a :class:`MoeRouting` over ``[B, T]`` to replay / record the MoE routing (entered here).
    Logits larger than :data:`LOGITS_BUDGET` (a 201k vocabulary) are never materialised whole: the LM head runs
    chunk by chunk over positions (:mod:`harmonyrl.learn.token_scores`), except with ``keep_logits``; there,
    ``needed`` (``[B, T-1]``, e.g. the loss mask) limits the head to the positions whose scores are read, and the
    others score 0. (The prompt is most of an episode: scoring only sampled tokens saves most of the head.)
    """
    b, t = input_ids.shape
    head, vocab = _lm_head(model)
    chunked = not keep_logits and b * (t - 1) * vocab > LOGITS_BUDGET
    with nullcontext() if routing is None else routing:
        logits, states = _forward(
            model, input_ids, attention_mask, value_head is not None, routing, not chunked, share_prefix
        )
    targets = input_ids[:, 1:]
    if logits is not None:
        logits = logits[:, :-1]
        logprobs, entropy = token_scores(logits, targets, entropy_grad)
    else:
        assert states is not None  # head=False always returns the final hidden states
        sel = torch.ones_like(targets, dtype=torch.bool) if needed is None else needed.bool()
        rows, chunk = states[:, :-1][sel][None], chunk_positions(1, vocab)  # [1, N, H]: the needed positions
        lp, ent = chunked_token_scores(head, rows, targets[sel][None], entropy_grad, chunk)
        logprobs, entropy = lp.new_zeros(b, t - 1).index_put((sel,), lp[0]), ent.new_zeros(b, t - 1)
        entropy = entropy.index_put((sel,), ent[0])
    values = None if value_head is None or states is None else value_head(states[:, :-1]).squeeze(-1)
    return Scored(logprobs, entropy, values, logits if keep_logits else None)


def micro_batches(batch: Batch, size: int) -> Iterator[Batch]:
    """Fixed-order slices of ``size`` rows, trimmed to their own longest sequence to save compute."""
    for start in range(0, batch.size, size):
        part = batch.select(torch.arange(start, min(start + size, batch.size)))
        width = int(part.attention_mask.sum(1).max().item())
        yield Batch(
            part.input_ids[:, :width],
            part.attention_mask[:, :width],
            part.loss_mask[:, : width - 1],
            part.sampler_logprobs[:, : width - 1],
            part.rewards,
            part.group_ids,
            None if part.routing is None else part.routing[:, :width],
        )
