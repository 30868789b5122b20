"""A lean, KV-cached forward pass over a ``GptOssForCausalLM``'s own modules, for the embedded engine.

Why not call the HF model with a ``DynamicCache``? Per-step Python overhead (mask builders, cache objects,
output dataclasses) dominates at our model sizes, and the HF cache cannot hold rows of different lengths
that join and leave between steps. This module reuses the HF parameters and the HF ``router`` modules (so MoE
routing is the trainer's, token for token) and re-implements only attention around a preallocated cache:

* cache: :class:`~harmonyrl.engine.local.kv_cache.KVCache`, per layer; a slot is one in-flight request. Sliding
  layers keep a ring of their window; a query there attends to the ring's history plus the new keys.
* prefill: newly admitted prompts' tails, right-padded to ``[n, T]``, each after the cached prefix already
  copied into its slot (see :mod:`harmonyrl.engine.local.prefix_cache`). When every row starts at the same
  position one causal (or sliding-window) mask serves all rows; otherwise each row gets its own. Padded
  queries compute garbage that is never read (valid queries never see a padded key: it lies in their future).
  MoE as :func:`~harmonyrl.engine.local.moe.routed_moe`.
* decode: one token per active row at per-row positions ``[B]``; keys ``0..max(pos)`` of each row's slot on full
  layers, the ring's ``W`` entries on sliding ones, masked per row. MoE: the routed experts only, as in prefill.

Weights are read, never copied, with one exception that costs nothing: when the q/k/v projections lie back to back
in one storage (an engine that owns its weights lays them out so) they run as one GEMM over a view; otherwise
(weights shared with the trainer) as three, the same bits (a GEMM's columns do not depend on their neighbours).

The attention math lives in :func:`sink_attention` alone, so a faster kernel can replace it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import GptOssForCausalLM
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP

from harmonyrl.engine.local.kv_cache import KVCache, KVSnapshot
from harmonyrl.engine.local.moe import routed_moe

EAGER_MAX_QUERIES = 16
"""Up to this many queries per row, :func:`sink_attention` runs eager instead of the fused kernel."""


def sink_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """GPT-OSS attention with sinks and grouped KV heads (same math as HF ``eager_attention_forward``).

    Shapes: ``q`` ``[B, H, T, D]``; ``k``, ``v`` ``[B, KVH, S, D]``; ``sinks`` ``[H]``; ``mask`` additive
    (0 / -inf), broadcastable to ``[B, 1, T, S]``. Returns ``[B, H, T, D]``.

    Each head's sink is one extra logit that joins the softmax denominator and is then dropped, so a head
    can attend to "nothing". Query heads are grouped by KV head (head ``h`` uses KV head ``h // G``).

    Two exact formulations, picked by shape because each wins where the other loses on CPU:
    * ``T > EAGER_MAX_QUERIES`` (prefill): fused ``scaled_dot_product_attention`` with one extra all-zero
      key/value whose mask entry is the head's sink: its logit is ``0 + sink`` and its value contributes
      nothing — exactly "join the denominator, then drop". ~2x faster than eager at 32x160 tokens.
    * few queries per row (decode; a continued conversation's short tail): eager, folding the group into the
      query axis instead of ``repeat_kv`` copies; there the fused kernel's setup costs more than it saves.
    """
    b, h, t, d = q.shape
    kvh, s = k.shape[1], k.shape[2]
    if t > EAGER_MAX_QUERIES:
        zero = k.new_zeros(b, kvh, 1, d)
        sink_col = sinks.to(mask.dtype).view(1, h, 1, 1).expand(mask.shape[0], h, t, 1)
        full_mask = torch.cat([mask.expand(mask.shape[0], h, t, s), sink_col], dim=-1)
        return F.scaled_dot_product_attention(
            q, torch.cat([k, zero], dim=2), torch.cat([v, zero], dim=2), attn_mask=full_mask, enable_gqa=True
        )
    g = h // kvh
    scores = torch.matmul(q.reshape(b, kvh, g * t, d), k.transpose(2, 3)) * (d**-0.5)
    scores = scores.view(b, h, t, s) + mask
    combined = torch.cat([scores, sinks.view(1, h, 1, 1).expand(b, h, t, 1)], dim=-1)
    if combined.dtype != torch.float32:  # HF shifts by the row max first, rounding to bf16 / fp16 on the way
        combined = combined - combined.amax(dim=-1, keepdim=True)
    # in fp32 that shift is softmax's own, computed the same way: skipping it changes no bit
    probs = torch.softmax(combined, dim=-1)[..., :-1]
    out = torch.matmul(probs.reshape(b, kvh, g * t, s), v)
    return out.view(b, h, t, d)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """HF GPT-OSS RoPE on ``x`` ``[B, heads, T, D]`` with doubled tables ``cos`` = ``[cos, cos]`` and ``sin`` =
    ``[-sin, sin]`` ``[B, 1, T, D]`` (see :meth:`LeanForward._rope_tables`): ``x·cos + swap_halves(x)·sin``.

    Per half that is ``first·cos + second·(-sin)`` and ``second·cos + first·sin``: HF's ``first·cos - second·sin``
    and ``second·cos + first·sin`` to the bit (``a - b`` is ``a + (-b)`` in IEEE), in 4 ops instead of 8.
    """
    swapped = torch.unflatten(x, -1, (2, -1)).flip(-2).flatten(-2)
    return x * cos + swapped * sin


@dataclass(frozen=True)
class _Layer:
    """One decoder layer's weights as the engine reads them (rebuilt by :meth:`LeanForward.refresh`), so a
    decode step calls ``F.linear`` / ``F.rms_norm`` on plain tensors instead of going through modules."""

    norm_w: torch.Tensor  # input RMSNorm weight, fp32
    post_w: torch.Tensor  # post-attention RMSNorm weight, fp32
    eps: float  # both norms' epsilon (the config's rms_norm_eps)
    proj: tuple[tuple[torch.Tensor, torch.Tensor | None], ...]  # (weight, bias) of q, k and v: their own tensors
    qkv_w: torch.Tensor | None  # [(H + 2·KVH)·D, hidden]: a view of q, k, v's weights where they lie back to back
    qkv_b: torch.Tensor | None  # [(H + 2·KVH)·D] (small: a copy)
    o_w: torch.Tensor
    o_b: torch.Tensor | None
    sinks: torch.Tensor  # [H]; all -inf for a sink-less engine
    mlp: GptOssMLP  # its router module routes (and records routing); its experts are read as they are
    sliding: bool

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """q/k/v of ``x`` ``[..., hidden]`` → ``[..., (H + 2·KVH)·D]``: one GEMM over the fused view, else three."""
        if self.qkv_w is not None:
            return F.linear(x, self.qkv_w, self.qkv_b)
        return torch.cat([F.linear(x, w, b) for w, b in self.proj], dim=-1)


class LeanForward:
    """Prefill / decode over the parameters of ``model`` (the engine's own modules; their tensors may be the trainer's).

    Call :meth:`refresh` after the model's weights change (or are replaced): it re-reads every tensor, finds whether
    q/k/v lie back to back (one GEMM over a view), and rebuilds the few small things derived from them (fp32 norm
    weights, the q/k/v bias, the sink row). Nothing the size of a weight is copied.
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
        dtype, self.device = model.lm_head.weight.dtype, model.lm_head.weight.device
        kinds = cfg.layer_types
        assert kinds is not None  # GptOssConfig fills it in when the config leaves it out
        sliding = [kind == "sliding_attention" for kind in kinds]
        self.cache = KVCache(
            sliding, max_batch, self.kv_heads, max_seq_len, self.head_dim, self.window, dtype, self.device
        )
        self._rope: tuple[torch.Tensor, torch.Tensor] | None = None
        self._arange = torch.arange(max_seq_len, device=self.device)
        self._layers: list[_Layer] = []
        self._final_norm: tuple[torch.Tensor, float] = (torch.empty(0, device=self.device), 0.0)
        self.refresh()

    def refresh(self) -> None:
        """Rebuild every :class:`_Layer` from the model's current parameters."""
        self._layers = []
        norm = self.model.model.norm
        self._final_norm = (norm.weight.detach().float(), norm.variance_epsilon)
        kinds = self.model.config.layer_types
        assert kinds is not None  # GptOssConfig fills it in when the config leaves it out
        for layer, kind in zip(self.layers, kinds, strict=True):
            att, mlp = layer.self_attn, layer.mlp
            projections = (att.q_proj, att.k_proj, att.v_proj)
            biases = [p.bias for p in projections]
            self._layers.append(
                _Layer(
                    norm_w=layer.input_layernorm.weight.detach().float(),
                    post_w=layer.post_attention_layernorm.weight.detach().float(),
                    eps=layer.input_layernorm.variance_epsilon,
                    proj=tuple((p.weight.detach(), None if p.bias is None else p.bias.detach()) for p in projections),
                    qkv_w=_adjacent([p.weight.detach() for p in projections]),
                    qkv_b=None if biases[0] is None else torch.cat(biases).detach(),
                    o_w=att.o_proj.weight.detach(),
                    o_b=None if att.o_proj.bias is None else att.o_proj.bias.detach(),
                    sinks=att.sinks.detach() if self.use_sinks else torch.full_like(att.sinks, float("-inf")),
                    mlp=mlp,
                    sliding=kind == "sliding_attention",
                )
            )

    @property
    def specs(self) -> list[_Layer]:
        """Each decoder layer's weights as the engine reads them (rebuilt by :meth:`refresh`)."""
        return self._layers

    def derived(self) -> list[torch.Tensor]:
        """Every tensor this forward holds besides the model's and the cache (some are the model's own, e.g. an
        fp32 norm weight's ``.float()``; callers count storages): norms, biases, sinks, RoPE tables."""
        out = [self._final_norm[0], *(self._rope or ())]
        for spec in self._layers:
            out += [spec.norm_w, spec.post_w, spec.sinks, *([] if spec.qkv_b is None else [spec.qkv_b])]
        return out

    @property
    def final_norm(self) -> tuple[torch.Tensor, float]:
        """The final RMSNorm's fp32 weight and epsilon."""
        return self._final_norm

    def _qkv(
        self, i: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Normed hidden ``x`` ``[B, T, hidden]`` → roped q ``[B, H, T, D]``, roped k and v ``[B, KVH, T, D]``."""
        b, t, _ = x.shape
        layer = self._layers[i]
        qkv = layer.project(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        qk = _rope(qkv[:, : self.heads + self.kv_heads], cos, sin)  # one rotation for q and k together
        return qk[:, : self.heads], qk[:, self.heads :], qkv[:, self.heads + self.kv_heads :]

    def _block_tail(self, i: int, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Output projection, residual, then the MoE (:func:`routed_moe`) on ``[B, T, hidden]``."""
        layer = self._layers[i]
        b, _, t, _ = attn.shape
        x = x + F.linear(attn.transpose(1, 2).reshape(b, t, -1), layer.o_w, layer.o_b)
        normed = _rms(x, layer.post_w, layer.eps)
        return x + routed_moe(layer.mlp, normed.view(b * t, -1)).view(b, t, -1)

    def _rope_tables(self, x: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Doubled cos/sin ``[B, 1, T, D]`` (see :func:`_rope`) at per-row positions ``[B, T]``, looked up in a
        table that the model's own ``rotary_emb`` filled once for every position (each entry is computed
        elementwise, so a lookup is bit-identical to calling it per step, minus ~10 small ops per step)."""
        cos_t, sin_t = self.rope_table(x)
        return cos_t[pos].unsqueeze(1), sin_t[pos].unsqueeze(1)

    def rope_table(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Doubled cos/sin ``[max_seq_len, D]`` for every position, in ``x``'s dtype (computed once)."""
        if self._rope is None or self._rope[0].dtype != x.dtype:
            cos, sin = self.model.model.rotary_emb(x, self._arange[None])
            cos, sin = cos[0], sin[0]  # [max_seq_len, D/2]
            self._rope = (torch.cat([cos, cos], dim=-1), torch.cat([-sin, sin], dim=-1))
        return self._rope

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        """Final norm + LM head on last hidden states ``[B, hidden]`` → fp32 logits ``[B, V]``."""
        return F.linear(_rms(h, *self._final_norm), self.model.lm_head.weight).float()

    def _row_masks(self, pos: torch.Tensor, span: int, dtype: torch.dtype) -> dict[bool, torch.Tensor]:
        """Additive masks ``[B, 1, T, span]`` for queries at per-row positions ``pos`` ``[B, T]`` (or ``[B]``:
        one query per row, ``T = 1``) over keys ``0 .. span-1``, keyed by "is a sliding layer". Sliding keeps
        keys ``> pos - window`` (HF's ``sliding_window_overlay``)."""
        dist = pos[..., None] - self._arange[:span]  # query position minus key position
        full = dist >= 0
        shape = (pos.shape[0], 1, -1, span)
        return {
            False: _additive(full, dtype).view(shape),
            True: _additive(full & (dist < self.window), dtype).view(shape),
        }

    def _prompt_masks(self, start: int, t: int, dtype: torch.dtype) -> dict[bool, torch.Tensor]:
        """Additive masks ``[1, 1, T, start + T]`` for queries at positions ``start .. start+T-1`` over keys
        ``0 .. start+T-1``, keyed by "is a sliding layer". Every row starts at the same position."""
        q_idx, k_idx = self._arange[start : start + t, None], self._arange[None, : start + t]
        causal = k_idx <= q_idx
        return {
            False: _additive(causal, dtype).view(1, 1, t, start + t),
            True: _additive(causal & (k_idx > q_idx - self.window), dtype).view(1, 1, t, start + t),
        }

    def prefill(
        self, tokens: torch.Tensor, lengths: torch.Tensor, slots: torch.Tensor, starts: torch.Tensor | int = 0
    ) -> torch.Tensor:
        """Run right-padded prompt tails ``[n, T]`` (true ``lengths`` ``[n]``) into cache ``slots`` ``[n]``.

        Row ``r``'s tail sits at positions ``starts[r] ..`` (an int: every row alike); the slot already holds
        the keys and values of the positions before (a cached prefix, see :meth:`load_prefix`).
        Returns fp32 logits ``[n, V]`` at each prompt's last real token (the first sampled position).
        The last layer needs keys/values for every position but attention + MoE only at that last token
        per row, so it runs them on ``[n, 1]`` queries (exact; saves ~1/L of the prefill FLOPs).

        When every row starts at 0, one ``[1, 1, T, T]`` mask serves all rows and keys come straight from the
        projection. Otherwise (a cached prefix, or *ragged*: rows continuing different cached conversations) each
        row gets its own mask over keys read from its slot (a sliding layer: the ring's history before the tail,
        then the tail's own keys), only real tokens are written to the cache, and padded queries compute garbage
        that is never read.
        """
        n, t = tokens.shape
        start_t = torch.as_tensor(starts, device=self.device).expand(n)
        ragged = bool((start_t != start_t[0]).any())
        start = int(start_t[0])
        rows, last = torch.arange(n, device=self.device), lengths - 1
        x = self.model.model.embed_tokens(tokens)
        pos = start_t[:, None] + self._arange[:t]  # [n, T]
        real_r, real_t = (self._arange[:t] < lengths[:, None]).nonzero(as_tuple=True)
        # a ring takes each row's last W real positions only: padding would overwrite real keys, and more than W
        # positions would put two in one entry
        recent = real_t >= lengths[real_r] - self.window
        ring_r, ring_t = real_r[recent], real_t[recent]
        if ragged:
            span = int((start_t + lengths).max())
            masks = self._row_masks(pos, span, x.dtype)
            cos, sin = self._rope_tables(x, pos.clamp(max=self._arange.shape[0] - 1))
        else:
            span = start + t
            masks = self._prompt_masks(start, t, x.dtype)
            cos, sin = self._rope_tables(x, self._arange[start:span].expand(n, t))
        history = start > 0 or ragged
        ring_keys = ring_mask = None
        if history and any(self.cache.ring(i) for i in range(len(self._layers))):
            # positions of a ring layer's keys: its history (W - 1 before the tail), then the tail
            ring_keys = torch.cat([start_t[:, None] - self.window + 1 + self._arange[: self.window - 1], pos], dim=1)
            ring_mask = self._window_mask(pos, ring_keys, x.dtype)
        for i, spec in enumerate(self._layers):
            q, k, v = self._qkv(i, _rms(x, spec.norm_w, spec.eps), cos, sin)
            ring = self.cache.ring(i)
            if ring and history:
                past_k, past_v = self.cache.history(i, slots, start_t)  # before this tail's writes overwrite them
            if ragged or ring:
                at_r, at_t = (ring_r, ring_t) if ring else (real_r, real_t)
                self.cache.write(i, slots[at_r], pos[at_r, at_t], k[at_r, :, at_t], v[at_r, :, at_t])
            else:  # padded positions too: each is written again (by decode) before any query reads it
                self.cache.write_span(i, slots, start, k, v)
            mask = masks[spec.sliding]
            if ring and history:
                assert ring_keys is not None and ring_mask is not None
                k, v, mask = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2), ring_mask
            elif history:
                k, v = self.cache.k[i][slots, :, :span], self.cache.v[i][slots, :, :span]
            if i == len(self._layers) - 1:
                q, x = q[rows, :, last][:, :, None], x[rows, last][:, None]  # [n, H, 1, D], [n, 1, hid]
                if ring and history:
                    assert ring_keys is not None
                    mask = self._window_mask((start_t + last)[:, None], ring_keys, x.dtype)
                else:
                    mask = self._row_masks(start_t + last, span, x.dtype)[spec.sliding]
            attn = sink_attention(q, k, v, spec.sinks, mask)
            x = self._block_tail(i, x, attn)
        return self._logits(x[:, 0])

    def _window_mask(self, queries: torch.Tensor, keys: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Additive sliding-window mask ``[n, 1, Tq, S]`` for per-row query positions ``[n, Tq]`` over per-row key
        positions ``[n, S]``: a key is seen when it is at 0 or later, not in the future and within the window."""
        dist = queries[:, :, None] - keys[:, None, :]
        allowed = (keys[:, None, :] >= 0) & (dist >= 0) & (dist < self.window)
        return _additive(allowed, dtype)[:, None]

    def prefix(self, tokens: torch.Tensor) -> KVSnapshot:
        """Keys and values of one token prefix ``[P]``.

        Computed once and copied into every slot whose prompt starts with it (:meth:`load_prefix`), so an
        environment's shared system + developer messages are not recomputed for each episode.
        """
        x = self.model.model.embed_tokens(tokens[None])
        t = x.shape[1]
        cos, sin = self._rope_tables(x, self._arange[:t][None])
        masks = self._prompt_masks(0, t, x.dtype)
        keys, values = [], []
        for i, spec in enumerate(self._layers):
            q, k, v = self._qkv(i, _rms(x, spec.norm_w, spec.eps), cos, sin)
            keep = min(t, self.cache.caps[i])  # a ring layer: its last W positions
            keys.append(k[0, :, t - keep :].clone())
            values.append(v[0, :, t - keep :].clone())
            if i < len(self._layers) - 1:  # the last layer's output is never read
                x = self._block_tail(i, x, sink_attention(q, k, v, spec.sinks, masks[spec.sliding]))
        return KVSnapshot(tuple(keys), tuple(values), t)

    def load_prefix(self, snap: KVSnapshot, slots: torch.Tensor) -> None:
        """Copy cached keys and values (a :meth:`prefix` result, or a finished conversation's) into positions
        ``0 .. length-1`` of cache ``slots`` ``[n]``."""
        self.cache.load(snap, slots)

    def move(self, src: int, dst: int, positions: int) -> None:
        """Copy cache slot ``src``'s keys/values at positions ``0 .. positions-1`` into slot ``dst``."""
        self.cache.move(src, dst, positions)

    def decode(self, tokens: torch.Tensor, positions: list[int], slots: list[int]) -> torch.Tensor:
        """One token per row: ids ``[B]`` at host ``positions`` into cache ``slots`` (both length ``B``).

        Returns fp32 logits ``[B, V]`` for the next position of each row. Keys are read over ``[0, max(pos)]`` on
        full layers and over the ring's ``W`` entries on sliding ones (in ring order: entry ``j`` holds position
        ``pos - ((pos - j) mod W)``, masked while that is negative), so sliding layers cost O(window), not
        O(length). When the slots are one contiguous run (the usual case: slots are handed out lowest-first) keys
        are a view, not a gather.
        """
        b, span = tokens.shape[0], max(positions) + 1
        heads, kv = self.heads, self.kv_heads
        pos, slot_t = torch.tensor(positions, device=self.device), torch.tensor(slots, device=self.device)
        x = F.embedding(tokens, self.model.model.embed_tokens.weight)  # [B, hidden]
        cos, sin = self._rope_tables(x, pos)  # [B, 1, D]
        masks = self._row_masks(pos, span, x.dtype)
        ring_mask = None
        lo = slots[0]
        rows: slice | torch.Tensor = slice(lo, lo + b) if slots == list(range(lo, lo + b)) else slot_t
        for i, layer in enumerate(self._layers):
            qkv = layer.project(_rms(x, layer.norm_w, layer.eps)).view(b, -1, self.head_dim)
            qk = _rope(qkv[:, : heads + kv], cos, sin)  # [B, H + KVH, D]
            self.cache.write(i, slot_t, pos, qk[:, heads:], qkv[:, heads + kv :])
            ck, cv = self.cache.k[i], self.cache.v[i]
            if self.cache.ring(i):
                if ring_mask is None:
                    entry = self._arange[: self.window]
                    held = pos[:, None] - (pos[:, None] - entry) % self.window  # [B, W]: position each entry holds
                    ring_mask = _additive(held >= 0, x.dtype)[:, None, None]
                keys, values, mask = ck[rows], cv[rows], ring_mask
            else:
                keys, values, mask = ck[rows, :, :span], cv[rows, :, :span], masks[layer.sliding]
            attn = sink_attention(qk[:, :heads, None], keys, values, layer.sinks, mask)  # [B, H, 1, D]
            x = x + F.linear(attn.view(b, -1), layer.o_w, layer.o_b)
            x = x + routed_moe(layer.mlp, _rms(x, layer.post_w, layer.eps))
        return self._logits(x)


def _adjacent(weights: list[torch.Tensor]) -> torch.Tensor | None:
    """One ``[sum of rows, in]`` view of 2-D weights that lie back to back in one storage, contiguous and in order
    (an engine that owns its weights lays q, k, v out so), or None."""
    first = weights[0]
    if first.device.type == "meta" or not all(w.is_contiguous() for w in weights):
        return None
    storage, offset = first.untyped_storage().data_ptr(), first.storage_offset()
    for w in weights:
        if w.untyped_storage().data_ptr() != storage or w.storage_offset() != offset or w.shape[1] != first.shape[1]:
            return None
        offset += w.numel()
    return first.as_strided((sum(w.shape[0] for w in weights), first.shape[1]), (first.shape[1], 1))


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """An HF RMSNorm (fp32 ``weight``, ``eps``) as one fused op instead of ~7 eager ones."""
    return F.rms_norm(x.float(), (x.shape[-1],), weight, eps).to(x.dtype)


def _additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Boolean mask → additive mask (0 where allowed, -inf elsewhere)."""
    zeros = torch.zeros((), dtype=dtype, device=allowed.device)
    return torch.where(allowed, zeros, torch.tensor(float("-inf"), dtype=dtype, device=allowed.device))
