"""A lean, KV-cached forward pass over a ``GptOssForCausalLM``'s own modules, for the embedded engine.

Why not call the HF model with a ``DynamicCache``? Per-step Python overhead (mask builders, cache objects,
output dataclasses) dominates at our model sizes, and the HF cache cannot hold rows of different lengths
that join and leave between steps. This module reuses the HF parameters and the HF ``router`` modules (so MoE
routing is the trainer's, token for token) and re-implements only attention around a preallocated cache:

* cache ``k``/``v``: ``[layers, slots, kv_heads, max_seq_len, head_dim]``; a slot is one in-flight request.
* prefill: newly admitted prompts, right-padded to ``[n, T]``; every row starts at the same position (0,
  or the length of a shared prefix whose keys/values were copied into the slots), so one causal (or
  sliding-window) mask serves all rows; padded queries compute garbage that is never read (valid queries
  never see a padded key: it lies in their future).
* decode: one token per active row at per-row positions ``[B]``; keys ``0..max(pos)`` of each row's slot,
  masked per row. The MoE of a decode step runs as :func:`dense_moe` (same router module, same routing).

The attention math lives in :func:`sink_attention` alone, so a faster kernel can replace it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import GptOssForCausalLM


def sink_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """GPT-OSS attention with sinks and grouped KV heads (same math as HF ``eager_attention_forward``).

    Shapes: ``q`` ``[B, H, T, D]``; ``k``, ``v`` ``[B, KVH, S, D]``; ``sinks`` ``[H]``; ``mask`` additive
    (0 / -inf), broadcastable to ``[B, 1, T, S]``. Returns ``[B, H, T, D]``.

    Each head's sink is one extra logit that joins the softmax denominator and is then dropped, so a head
    can attend to "nothing". Query heads are grouped by KV head (head ``h`` uses KV head ``h // G``).

    Two exact formulations, picked by shape because each wins where the other loses on CPU:
    * ``T > 1`` (prefill): fused ``scaled_dot_product_attention`` with one extra all-zero key/value whose
      mask entry is the head's sink: its logit is ``0 + sink`` and its value contributes nothing — exactly
      "join the denominator, then drop". ~2x faster than eager at 32x160 tokens.
    * ``T == 1`` (decode): eager, folding the group into the query axis instead of ``repeat_kv`` copies;
      at one query per row the fused kernel's setup costs more than it saves.
    """
    b, h, t, d = q.shape
    kvh, s = k.shape[1], k.shape[2]
    if t > 1:
        zero = k.new_zeros(b, kvh, 1, d)
        sink_col = sinks.to(mask.dtype).view(1, h, 1, 1).expand(mask.shape[0], h, t, 1)
        full_mask = torch.cat([mask.expand(mask.shape[0], h, t, s), sink_col], dim=-1)
        return F.scaled_dot_product_attention(
            q, torch.cat([k, zero], dim=2), torch.cat([v, zero], dim=2), attn_mask=full_mask, enable_gqa=True
        )
    g = h // kvh
    scores = torch.matmul(q.reshape(b, kvh, g * t, d), k.transpose(2, 3)) * (d**-0.5)
    scores = scores.view(b, h, t, s) + mask
    sink = sinks.view(1, h, 1, 1).expand(b, h, t, 1)
    combined = torch.cat([scores, sink], dim=-1)
    combined = combined - combined.amax(dim=-1, keepdim=True)
    probs = torch.softmax(combined, dim=-1)[..., :-1]
    out = torch.matmul(probs.reshape(b, kvh, g * t, s), v)
    return out.view(b, h, t, d)


@dataclass(frozen=True)
class DenseExperts:
    """One layer's experts flattened for :func:`dense_moe`: ``w1`` ``[hidden, E·2I]``, ``b1`` ``[E·2I]``,
    ``w2`` ``[E·I, hidden]``, ``b2`` ``[E, hidden]``."""

    w1: torch.Tensor
    b1: torch.Tensor
    w2: torch.Tensor
    b2: torch.Tensor

    @staticmethod
    def of(experts: torch.nn.Module) -> DenseExperts:
        e, hidden, two_i = experts.gate_up_proj.shape
        return DenseExperts(
            w1=experts.gate_up_proj.detach().permute(1, 0, 2).reshape(hidden, e * two_i).contiguous(),
            b1=experts.gate_up_proj_bias.detach().reshape(e * two_i),
            w2=experts.down_proj.detach().reshape(e * two_i // 2, hidden),
            b2=experts.down_proj_bias.detach(),
        )


@dataclass(frozen=True)
class SplitExperts:
    """One layer's experts for :func:`sparse_moe`: ``w1`` ``[E, hidden, 2I]`` with each expert's gate columns
    first and up columns second (HF interleaves them: gate = even, up = odd), ``b1`` ``[E, 2I]`` likewise."""

    w1: torch.Tensor
    b1: torch.Tensor

    @staticmethod
    def of(experts: torch.nn.Module) -> SplitExperts:
        two_i = experts.gate_up_proj.shape[2]
        order = torch.cat([torch.arange(0, two_i, 2), torch.arange(1, two_i, 2)])
        return SplitExperts(
            w1=experts.gate_up_proj.detach()[:, :, order].contiguous(),
            b1=experts.gate_up_proj_bias.detach()[:, order].contiguous(),
        )


def sparse_moe(mlp: torch.nn.Module, split: SplitExperts, x: torch.Tensor) -> torch.Tensor:
    """The GPT-OSS MoE block on many tokens ``x`` ``[N, hidden]`` → ``[N, hidden]``, each through its top-k.

    Routing is the layer's own ``router`` module. Token-expert pairs are grouped by expert, each expert runs
    its two GEMMs on its contiguous group (GEMM, then bias, as transformers' grouped-experts path does), and
    each token sums its k weighted outputs in top-k order: the same ops in the same order as the ``mlp``
    module, so the result is its bit for bit (tested), at about half its time on CPU. The gain is the
    de-interleaved gate/up columns (:class:`SplitExperts`): the gate math reads contiguous rows, not every
    other float.
    """
    _, scores, idx = mlp.router(x)  # [N, k] each
    experts, (n, k), half = mlp.experts, idx.shape, split.w1.shape[2] // 2
    order = idx.reshape(-1).argsort(stable=True)  # pair p = token p // k, its (p % k)-th choice
    counts = torch.bincount(idx.reshape(-1), minlength=split.w1.shape[0]).tolist()
    grouped = x[order // k]
    outs, start = [], 0
    for e, count in enumerate(counts):
        if count:
            h = (grouped[start : start + count] @ split.w1[e]).add_(split.b1[e])
            gate = h[:, :half].clamp(max=experts.limit)
            up = h[:, half:].clamp(min=-experts.limit, max=experts.limit)
            act = (up + 1) * (gate * torch.sigmoid(gate * experts.alpha))
            outs.append((act @ experts.down_proj[e]).add_(experts.down_proj_bias[e]))
            start += count
    weighted = torch.cat(outs) * scores.reshape(-1)[order, None]
    unsorted = torch.empty_like(weighted)
    unsorted[order] = weighted
    return unsorted.view(n, k, -1).sum(dim=1)


def dense_moe(mlp: torch.nn.Module, flat: DenseExperts, x: torch.Tensor) -> torch.Tensor:
    """The GPT-OSS MoE block on few tokens ``x`` ``[N, hidden]`` → ``[N, hidden]``, all experts densely.

    Routing comes from the layer's own ``router`` module, so expert choice and weights are the trainer's.
    The expert math is HF's (interleaved gate/up, clamped SwiGLU via the module's ``_apply_gate``, biases),
    rewritten as two plain GEMMs over all ``E`` experts, non-selected experts weighted 0:
    ``sum_e w_e (act_e @ D_e + b_e) == concat_e(w_e act_e) @ vstack_e(D_e) + w @ b``.
    For a decode step (N = batch) this replaces HF's sort / histc / grouped_mm dispatch (~20 small ops)
    with 2 GEMMs; it costs E/k x the expert FLOPs, so prefill (N large) uses :func:`sparse_moe` instead.
    Results differ from the sparse path only by fp32 summation order (~1e-7).
    """
    _, scores, idx = mlp.router(x)
    n, e = x.shape[0], flat.b2.shape[0]
    weights = torch.zeros(n, e, dtype=x.dtype).scatter_(1, idx, scores)  # [N, E], 0 for unrouted experts
    act = mlp.experts._apply_gate(torch.addmm(flat.b1, x, flat.w1).view(n, e, -1))  # [N, E, I]
    return torch.addmm(weights @ flat.b2, (act * weights[:, :, None]).view(n, -1), flat.w2)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate halves of ``x`` ``[B, heads, T, D]`` by ``cos``/``sin`` ``[B, 1, T, D/2]`` (HF GPT-OSS RoPE)."""
    first, second = torch.chunk(x, 2, dim=-1)
    return torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)


class KVCache:
    """Preallocated keys/values ``[layers, slots, kv_heads, max_seq_len, head_dim]`` (zeros, never NaN,
    so masked stale entries contribute exactly 0 to attention)."""

    def __init__(
        self, layers: int, slots: int, kv_heads: int, max_seq_len: int, head_dim: int, dtype: torch.dtype
    ) -> None:
        shape = (layers, slots, kv_heads, max_seq_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype)
        self.v = torch.zeros(shape, dtype=dtype)


class LeanForward:
    """Prefill / decode over the parameters of ``model`` (which the caller owns and keeps private).

    Call :meth:`refresh` after the model's weights change: q/k/v projections are fused into one matrix
    ``[(H + 2·KVH)·D, hidden]`` here (one GEMM instead of three per layer).
    """

    def __init__(self, model: GptOssForCausalLM, max_batch: int, max_seq_len: int, sinks: bool = True) -> None:
        cfg = model.config
        self.model = model
        self.use_sinks = sinks
        """False runs every head without its sink (a sink logit of -inf adds exp(-inf) = 0 to the softmax
        denominator): deliberately wrong, to reproduce a sink-less kernel's mismatch in experiments."""
        self.layers = list(model.model.layers)
        self.heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.window = int(cfg.sliding_window or max_seq_len)
        self.sliding = [t == "sliding_attention" for t in cfg.layer_types]
        dtype = model.lm_head.weight.dtype
        self.cache = KVCache(len(self.layers), max_batch, self.kv_heads, max_seq_len, self.head_dim, dtype)
        self._rope: tuple[torch.Tensor, torch.Tensor] | None = None
        self.qkv_w: list[torch.Tensor] = []
        self.qkv_b: list[torch.Tensor | None] = []
        self.experts: list[DenseExperts] = []
        self.split: list[SplitExperts] = []
        self.refresh()

    def refresh(self) -> None:
        """Rebuild the fused q/k/v and flattened expert weights from the model's current parameters."""
        self.qkv_w, self.qkv_b = [], []
        self.experts = [DenseExperts.of(layer.mlp.experts) for layer in self.layers]
        self.split = [SplitExperts.of(layer.mlp.experts) for layer in self.layers]
        for layer in self.layers:
            att = layer.self_attn
            self.qkv_w.append(torch.cat([att.q_proj.weight, att.k_proj.weight, att.v_proj.weight]).detach())
            biases = [att.q_proj.bias, att.k_proj.bias, att.v_proj.bias]
            self.qkv_b.append(None if biases[0] is None else torch.cat(biases).detach())  # type: ignore[arg-type]

    def _qkv(
        self, i: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Normed hidden ``x`` ``[B, T, hidden]`` → roped q ``[B, H, T, D]``, roped k and v ``[B, KVH, T, D]``."""
        b, t, _ = x.shape
        qkv = F.linear(x, self.qkv_w[i], self.qkv_b[i]).view(b, t, -1, self.head_dim).transpose(1, 2)
        qk = _rope(qkv[:, : self.heads + self.kv_heads], cos, sin)  # one rotation for q and k together
        return qk[:, : self.heads], qk[:, self.heads :], qkv[:, self.heads + self.kv_heads :]

    def _sinks(self, layer: torch.nn.Module) -> torch.Tensor:
        sinks = layer.self_attn.sinks
        return sinks if self.use_sinks else torch.full_like(sinks, float("-inf"))

    def _block_tail(self, i: int, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Output projection, residual, then the MoE on ``[B, T, hidden]``: :func:`dense_moe` for one token per
        row (decode), :func:`sparse_moe` for many (prefill)."""
        layer = self.layers[i]
        b, _, t, _ = attn.shape
        x = x + layer.self_attn.o_proj(attn.transpose(1, 2).reshape(b, t, -1))
        normed = _rms(layer.post_attention_layernorm, x)
        if t == 1:
            return x + dense_moe(layer.mlp, self.experts[i], normed.view(b, -1)).view(b, 1, -1)
        return x + sparse_moe(layer.mlp, self.split[i], normed.view(b * t, -1)).view(b, t, -1)

    def _rope_tables(self, x: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin ``[B, 1, T, D/2]`` at per-row positions ``[B, T]``, looked up in a table that the model's own
        ``rotary_emb`` filled once for every position (each entry is computed elementwise, so a lookup is
        bit-identical to calling it per step, minus ~10 small ops per decode step)."""
        if self._rope is None or self._rope[0].dtype != x.dtype:
            every = torch.arange(self.cache.k.shape[3])[None]
            cos, sin = self.model.model.rotary_emb(x, every)
            self._rope = (cos[0], sin[0])  # [max_seq_len, D/2]
        cos_t, sin_t = self._rope
        return cos_t[pos].unsqueeze(1), sin_t[pos].unsqueeze(1)

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        """Final norm + LM head on last hidden states ``[B, hidden]`` → fp32 logits ``[B, V]``."""
        return self.model.lm_head(_rms(self.model.model.norm, h)).float()

    def _row_masks(self, pos: torch.Tensor, span: int, dtype: torch.dtype) -> dict[bool, torch.Tensor]:
        """Additive masks ``[B, 1, 1, span]`` for one query per row at positions ``pos`` ``[B]``, keyed by
        "is a sliding layer". Sliding keeps keys ``> pos - window`` (HF's ``sliding_window_overlay``)."""
        k_pos, q_pos = torch.arange(span)[None, :], pos[:, None]
        full = k_pos <= q_pos
        shape = (pos.shape[0], 1, 1, span)
        return {
            False: _additive(full, dtype).view(shape),
            True: _additive(full & (k_pos > q_pos - self.window), dtype).view(shape),
        }

    def _prompt_masks(self, start: int, t: int, dtype: torch.dtype) -> dict[bool, torch.Tensor]:
        """Additive masks ``[1, 1, T, start + T]`` for queries at positions ``start .. start+T-1`` over keys
        ``0 .. start+T-1``, keyed by "is a sliding layer". Every row starts at the same position."""
        q_idx, k_idx = torch.arange(start, start + t)[:, None], torch.arange(start + t)[None, :]
        causal = k_idx <= q_idx
        return {
            False: _additive(causal, dtype).view(1, 1, t, start + t),
            True: _additive(causal & (k_idx > q_idx - self.window), dtype).view(1, 1, t, start + t),
        }

    def prefill(self, tokens: torch.Tensor, lengths: torch.Tensor, slots: torch.Tensor, start: int = 0) -> torch.Tensor:
        """Run right-padded prompt tails ``[n, T]`` (true ``lengths`` ``[n]``) into cache ``slots`` ``[n]``.

        The tails sit at positions ``start .. start+T-1``; when ``start > 0`` the slots already hold the keys
        and values of positions ``< start`` (a shared prefix, see :meth:`prefix` / :meth:`load_prefix`).
        Returns fp32 logits ``[n, V]`` at each prompt's last real token (the first sampled position).
        The last layer needs keys/values for every position but attention + MoE only at that last token
        per row, so it runs them on ``[n, 1]`` queries (exact; saves ~1/L of the prefill FLOPs).
        """
        n, t = tokens.shape
        span = start + t
        rows, last = torch.arange(n), lengths - 1
        x = self.model.model.embed_tokens(tokens)
        cos, sin = self._rope_tables(x, torch.arange(start, span).expand(n, t))
        masks = self._prompt_masks(start, t, x.dtype)
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(i, layer.input_layernorm(x), cos, sin)
            self.cache.k[i, slots, :, start:span] = k
            self.cache.v[i, slots, :, start:span] = v
            if start:
                k, v = self.cache.k[i, slots, :, :span], self.cache.v[i, slots, :, :span]
            if i == len(self.layers) - 1:
                q, x = q[rows, :, last][:, :, None], x[rows, last][:, None]  # [n, H, 1, D], [n, 1, hid]
                masks = self._row_masks(start + last, span, x.dtype)
            attn = sink_attention(q, k, v, self._sinks(layer), masks[self.sliding[i]])
            x = self._block_tail(i, x, attn)
        return self._logits(x[:, 0])

    def prefix(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values ``[layers, kv_heads, P, head_dim]`` (each) of one token prefix ``[P]``.

        Computed once and copied into every slot whose prompt starts with it (:meth:`load_prefix`), so an
        environment's shared system + developer messages are not recomputed for each episode.
        """
        x = self.model.model.embed_tokens(tokens[None])
        t = x.shape[1]
        cos, sin = self._rope_tables(x, torch.arange(t)[None])
        masks = self._prompt_masks(0, t, x.dtype)
        keys, values = [], []
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(i, layer.input_layernorm(x), cos, sin)
            keys.append(k[0])
            values.append(v[0])
            if i < len(self.layers) - 1:  # the last layer's output is never read
                x = self._block_tail(i, x, sink_attention(q, k, v, self._sinks(layer), masks[self.sliding[i]]))
        return torch.stack(keys), torch.stack(values)

    def load_prefix(self, kv: tuple[torch.Tensor, torch.Tensor], slots: torch.Tensor) -> None:
        """Copy a :meth:`prefix` result into positions ``0 .. P-1`` of cache ``slots`` ``[n]``."""
        k, v = kv
        p = k.shape[2]
        self.cache.k[:, slots, :, :p] = k[:, None]
        self.cache.v[:, slots, :, :p] = v[:, None]

    def decode(self, tokens: torch.Tensor, positions: list[int], slots: list[int]) -> torch.Tensor:
        """One token per row: ids ``[B]`` at host ``positions`` into cache ``slots`` (both length ``B``).

        Returns fp32 logits ``[B, V]`` for the next position of each row. Keys are read over
        ``[start, max(pos)]``: ``start = 0`` on full layers and ``min(pos) - window + 1`` on sliding ones
        (no row sees further back), so sliding layers cost O(window), not O(length). When the slots are one
        contiguous run (the usual case: slots are handed out lowest-first) keys are a view, not a gather.
        """
        b, span = tokens.shape[0], max(positions) + 1
        pos, slot_t = torch.tensor(positions), torch.tensor(slots)
        x = self.model.model.embed_tokens(tokens)[:, None, :]
        cos, sin = self._rope_tables(x, pos[:, None])
        masks = self._row_masks(pos, span, x.dtype)
        starts = {False: 0, True: max(0, min(positions) - self.window + 1)}
        lo = slots[0]
        rows: slice | torch.Tensor = slice(lo, lo + b) if slots == list(range(lo, lo + b)) else slot_t
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(i, _rms(layer.input_layernorm, x), cos, sin)
            ck, cv = self.cache.k[i], self.cache.v[i]
            ck[slot_t, :, pos] = k[:, :, 0]
            cv[slot_t, :, pos] = v[:, :, 0]
            start = starts[self.sliding[i]]
            keys, values = ck[rows, :, start:span], cv[rows, :, start:span]
            mask = masks[self.sliding[i]][..., start:]
            attn = sink_attention(q, keys, values, self._sinks(layer), mask)
            x = self._block_tail(i, x, attn)
        return self._logits(x[:, 0])


def _rms(norm: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The module's RMSNorm (same weight and eps) as one fused op instead of ~7 eager ones."""
    return F.rms_norm(x.float(), (x.shape[-1],), norm.weight.float(), norm.variance_epsilon).to(x.dtype)


def _additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Boolean mask → additive mask (0 where allowed, -inf elsewhere)."""
    zeros = torch.zeros((), dtype=dtype)
    return torch.where(allowed, zeros, torch.tensor(float("-inf"), dtype=dtype))
