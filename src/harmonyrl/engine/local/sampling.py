"""Batch-invariant sampling: per-row temperature / top-k / top-p with counter-based Gumbel noise.

Why counter-based noise: a request must sample the same tokens whatever else shares its batch and whenever
it arrived. A stateful ``torch.Generator`` cannot promise that; a hash of (seed, token index, vocab index)
can. We use Gumbel-max: ``argmax(filtered_logits / T + g)`` with ``g = -log(-log(u))`` is an exact sample
of ``softmax(filtered_logits / T)``, and ``u`` comes from an integer hash of 32-bit values. The C extension
computes it in one pass (``engine/csrc/sample.c``); :func:`gumbel_uniform` is the same hash in torch int64 ops,
the reference it is tested against and the fallback without the extension: the bits are the same either way.

``Generation.logprobs`` are ``log_softmax`` of the *unmodified* logits at the sampled token, so they are
directly comparable with the trainer's log-probs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from harmonyrl.engine.local import native
from harmonyrl.types import SamplingParams

_M32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B9


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """xorshift-multiply hash (``lowbias32`` shape), a bijection on 32-bit values held in int64 tensors.

    Both multipliers are odd and < 2**31, so with ``x < 2**32`` no int64 product overflows: the result is
    well defined (no reliance on signed wrap-around) and identical on every platform.
    """
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x1B873593) & _M32
    return x ^ (x >> 16)


_VOCAB_HASH: dict[tuple[int, torch.device], torch.Tensor] = {}


def _vocab_offsets(vocab_size: int, device: torch.device) -> torch.Tensor:
    """``[V]`` per-vocab-index offsets on ``device`` (cached: recomputing them every step costs a full pass)."""
    if (vocab_size, device) not in _VOCAB_HASH:
        offsets = (torch.arange(vocab_size, dtype=torch.int64, device=device) * _GOLDEN) & _M32
        _VOCAB_HASH[vocab_size, device] = offsets
    return _VOCAB_HASH[vocab_size, device]


def seed_key(seed: int) -> int:
    """Fold an arbitrary Python int seed into 32 bits (hi and lo halves both matter)."""
    lo = torch.tensor([seed & _M32], dtype=torch.int64)  # host: folds a Python int into a Python int
    hi = torch.tensor([(seed >> 32) & _M32], dtype=torch.int64)  # host
    return int(_mix32(_mix32(hi) ^ lo)[0])


def gumbel_noise(keys: torch.Tensor, counters: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Gumbel noise ``[B, V]`` (fp32), a pure function of ``keys`` ``[B]``, ``counters`` ``[B]`` (the index of
    the token within its request) and the vocab index. The uniforms come from the C extension where it is built
    (the same bits as :func:`gumbel_uniform`, in a tenth of the time), else from torch."""
    u = native.gumbel_uniform(keys, counters, vocab_size) if keys.device.type == "cpu" else None  # C: CPU only
    if u is None:
        u = gumbel_uniform(keys, counters, vocab_size)
    return u.log_().neg_().log_().neg_()  # -log(-log(u)), in place: [B, V] is the step's largest tensor


def gumbel_uniform(keys: torch.Tensor, counters: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The uniforms ``u`` ``[B, V]`` in (0, 1) behind :func:`gumbel_noise`, in torch (the reference)."""
    row = _mix32(_mix32(keys & _M32) ^ (counters & _M32))
    bits = _mix32_((row[:, None] + _vocab_offsets(vocab_size, keys.device)[None, :]).bitwise_and_(_M32))
    # top 23 bits + 0.5 are exact in fp32, so u lies strictly inside (0, 1): no log(0)
    return bits.bitwise_right_shift_(9).float().add_(0.5).mul_(1.0 / 2**23)


def _mix32_(x: torch.Tensor) -> torch.Tensor:
    """:func:`_mix32` in place on a fresh ``x`` (same ops, same bits, no temporaries of ``x``'s size)."""
    x ^= x >> 16
    x.mul_(0x7FEB352D).bitwise_and_(_M32)
    x ^= x >> 15
    x.mul_(0x1B873593).bitwise_and_(_M32)
    x ^= x >> 16
    return x


@dataclass(frozen=True)
class RowParams:
    """Per-row sampling parameters as tensors, each ``[B]``."""

    temperature: torch.Tensor  # float32; 0 = greedy
    top_k: torch.Tensor  # int64; 0 = off
    top_p: torch.Tensor  # float32; 1 = off
    keys: torch.Tensor  # int64 seed keys (see :func:`seed_key`)
    counters: torch.Tensor  # int64 token index within the request
    filtered: bool  # any row with top-k or top-p active (skips the sort otherwise)


def _filter(scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Top-k then top-p (on the top-k-renormalised distribution) over ``scaled`` ``[B, V]``; dropped → -inf.

    The most likely token is always kept, so ``top_k=1`` or a tiny ``top_p`` is exactly greedy.
    """
    vocab = scaled.shape[-1]
    sorted_logits, order = scaled.sort(dim=-1, descending=True)
    rank = torch.arange(vocab, device=scaled.device)[None, :]
    k = torch.where(top_k > 0, top_k, vocab)[:, None]
    sorted_logits = sorted_logits.masked_fill(rank >= k, float("-inf"))
    probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    keep_sorted = (mass_before < top_p[:, None]) & (rank < k)
    keep_sorted[:, 0] = True
    keep = torch.empty_like(keep_sorted).scatter_(1, order, keep_sorted)
    return scaled.masked_fill(~keep, float("-inf"))


def sample(logits: torch.Tensor, rows: RowParams) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row from fp32 ``logits`` ``[B, V]``.

    Returns ``(tokens [B] int64, logprobs [B] fp32)``; logprobs are of the unmodified distribution.
    """
    greedy = rows.temperature <= 0
    any_greedy = bool(greedy.any())  # host checks (µs on CPU) that skip a [B, V] divide-by-1 and argmax
    scaled = logits
    if not bool((rows.temperature == 1).all()):
        scaled = logits / torch.where(greedy, torch.ones_like(rows.temperature), rows.temperature)[:, None]
    if rows.filtered:
        scaled = _filter(scaled, rows.top_k, rows.top_p)
    tokens = (scaled + gumbel_noise(rows.keys, rows.counters, logits.shape[-1])).argmax(dim=-1)
    if any_greedy:
        tokens = torch.where(greedy, logits.argmax(dim=-1), tokens)
    logprobs = torch.log_softmax(logits, dim=-1).gather(1, tokens[:, None])[:, 0]
    return tokens, logprobs


def validate_request(prompt_ids: Sequence[int], params: SamplingParams, max_seq_len: int, vocab_size: int) -> list[int]:
    """Check a request up front (clear ``ValueError`` at the call site, not a crash in the worker)."""
    ids = [int(t) for t in prompt_ids]
    if not ids:
        raise ValueError("prompt_ids is empty: the engine needs at least one token to condition on")
    if len(ids) >= max_seq_len:
        raise ValueError(
            f"prompt has {len(ids)} tokens but max_seq_len={max_seq_len} leaves no room to generate "
            "(need len(prompt) < max_seq_len)"
        )
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"prompt ids out of range [0, {vocab_size}): {bad[:5]}")
    if not math.isfinite(params.temperature) or params.temperature < 0:
        raise ValueError(f"temperature must be finite and >= 0 (0 = greedy), got {params.temperature}")
    if not 0.0 < params.top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {params.top_p}")
    if params.top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 disables it), got {params.top_k}")
    if params.max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {params.max_new_tokens}")
    bad_stop = [t for t in params.stop_ids if not 0 <= t < vocab_size]
    if bad_stop:
        raise ValueError(f"stop_ids out of range [0, {vocab_size}): {bad_stop}")
    return ids
