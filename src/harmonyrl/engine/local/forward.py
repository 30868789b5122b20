"""A lean, KV-cached forward pass over a ``GptOssForCausalLM``'s own modules, for the embedded engine.

Why not call the HF model with a ``DynamicCache``? Per-step Python overhead (mask builders, cache objects,
output dataclasses) dominates at our model sizes, and the HF cache cannot hold rows of different lengths
that join and leave between steps. This module reuses the HF parameters and the HF ``router`` modules (so MoE
routing is the trainer's, token for token) and re-implements only attention around a preallocated cache:

* cache ``k``/``v``: ``[layers, slots, kv_heads, max_seq_len, head_dim]``; a slot is one in-flight request.
* prefill: newly admitted prompts' tails, right-padded to ``[n, T]``, each after the cached prefix already
  copied into its slot (see :mod:`harmonyrl.engine.local.prefix_cache`). When every row starts at the same
  position one causal (or sliding-window) mask serves all rows; otherwise each row gets its own. Padded
  queries compute garbage that is never read (valid queries never see a padded key: it lies in their future).
  MoE as :func:`~harmonyrl.engine.local.moe.sparse_moe`.
* decode: one token per active row at per-row positions ``[B]``; keys ``0..max(pos)`` of each row's slot,
  masked per row. MoE as :func:`~harmonyrl.engine.local.moe.dense_moe`.

The attention math lives in :func:`sink_attention` alone, so a faster kernel can replace it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import GptOssForCausalLM
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP

from harmonyrl.engine.local.moe import DenseExperts, SplitExperts, dense_moe, sparse_moe

EAGER_MAX_QUERIES = 16
"""Up to this many queries per row, :func:`sink_attention` runs eager instead of the fused kernel."""
DENSE_MAX_TOKENS = 64
"""Up to this many tokens, a layer's MoE runs every expert densely (:func:`dense_moe`): fewer, larger ops."""


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


class KVCache:
    """Preallocated keys/values ``[layers, slots, kv_heads, max_seq_len, head_dim]`` (zeros, never NaN,
    so masked stale entries contribute exactly 0 to attention)."""

    def __init__(
        self,
        layers: int,
        slots: int,
        kv_heads: int,
        max_seq_len: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | None = None,
    ) -> None:
        shape = (layers, slots, kv_heads, max_seq_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)


@dataclass(frozen=True)
class _Layer:
    """One decoder layer's weights as the engine reads them (rebuilt by :meth:`LeanForward.refresh`), so a
    decode step calls ``F.linear`` / ``F.rms_norm`` on plain tensors instead of going through modules."""

    norm_w: torch.Tensor  # input RMSNorm weight, fp32
    post_w: torch.Tensor  # post-attention RMSNorm weight, fp32
    eps: float  # both norms' epsilon (the config's rms_norm_eps)
    qkv_w: torch.Tensor  # q/k/v projections fused: [(H + 2·KVH)·D, hidden]
    qkv_b: torch.Tensor | None
    o_w: torch.Tensor
    o_b: torch.Tensor | None
    sinks: torch.Tensor  # [H]; all -inf for a sink-less engine
    mlp: GptOssMLP  # its router module routes (and records routing); its experts give limit and alpha
    dense: DenseExperts
    split: SplitExperts
    sliding: bool


class LeanForward:
    """Prefill / decode over the parameters of ``model`` (which the caller owns and keeps private).

    Call :meth:`refresh` after the model's weights change: q/k/v projections are fused into one matrix
    ``[(H + 2·KVH)·D, hidden]`` here (one GEMM instead of three per layer), and the experts re-laid out.
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
        self.cache = KVCache(len(self.layers), max_batch, self.kv_heads, max_seq_len, self.head_dim, dtype, self.device)
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
            biases = [att.q_proj.bias, att.k_proj.bias, att.v_proj.bias]
            split = SplitExperts.of(mlp.experts)
            self._layers.append(
                _Layer(
                    norm_w=layer.input_layernorm.weight.detach().float(),
                    post_w=layer.post_attention_layernorm.weight.detach().float(),
                    eps=layer.input_layernorm.variance_epsilon,
                    qkv_w=torch.cat([att.q_proj.weight, att.k_proj.weight, att.v_proj.weight]).detach(),
                    qkv_b=None if biases[0] is None else torch.cat(biases).detach(),
                    o_w=att.o_proj.weight.detach(),
                    o_b=None if att.o_proj.bias is None else att.o_proj.bias.detach(),
                    sinks=att.sinks.detach() if self.use_sinks else torch.full_like(att.sinks, float("-inf")),
                    mlp=mlp,
                    dense=DenseExperts.of(mlp.experts, split),
                    split=split,
                    sliding=kind == "sliding_attention",
                )
            )

    @property
    def specs(self) -> list[_Layer]:
        """Each decoder layer's weights as the engine reads them (rebuilt by :meth:`refresh`)."""
        return self._layers

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
        qkv = F.linear(x, layer.qkv_w, layer.qkv_b).view(b, t, -1, self.head_dim).transpose(1, 2)
        qk = _rope(qkv[:, : self.heads + self.kv_heads], cos, sin)  # one rotation for q and k together
        return qk[:, : self.heads], qk[:, self.heads :], qkv[:, self.heads + self.kv_heads :]

    def _block_tail(self, i: int, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Output projection, residual, then the MoE on ``[B, T, hidden]``: :func:`dense_moe` for few tokens,
        :func:`sparse_moe` for many."""
        layer = self._layers[i]
        b, _, t, _ = attn.shape
        x = x + F.linear(attn.transpose(1, 2).reshape(b, t, -1), layer.o_w, layer.o_b)
        normed = _rms(x, layer.post_w, layer.eps)
        flat = normed.view(b * t, -1)
        if b * t <= DENSE_MAX_TOKENS:
            return x + dense_moe(layer.mlp, layer.dense, flat).view(b, t, -1)
        return x + sparse_moe(layer.mlp, layer.split, flat).view(b, t, -1)

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

        When every row starts alike, one ``[1, 1, T, S]`` mask serves all rows and keys come straight from the
        projection. Otherwise (*ragged*: rows continuing different cached conversations) each row gets its own
        mask over keys gathered from its slot, only real tokens are written to the cache, and padded queries
        compute garbage that is never read.
        """
        n, t = tokens.shape
        start_t = torch.as_tensor(starts, device=self.device).expand(n)
        ragged = bool((start_t != start_t[0]).any())
        start = int(start_t[0])
        rows, last = torch.arange(n, device=self.device), lengths - 1
        x = self.model.model.embed_tokens(tokens)
        if ragged:
            pos = start_t[:, None] + self._arange[:t]  # [n, T]
            span = int((start_t + lengths).max())
            real_r, real_t = (self._arange[:t] < lengths[:, None]).nonzero(as_tuple=True)
            write_slots, write_pos = slots[real_r], pos[real_r, real_t]
            masks = self._row_masks(pos, span, x.dtype)
            cos, sin = self._rope_tables(x, pos.clamp(max=self._arange.shape[0] - 1))
        else:
            span = start + t
            masks = self._prompt_masks(start, t, x.dtype)
            cos, sin = self._rope_tables(x, self._arange[start:span].expand(n, t))
        for i, spec in enumerate(self._layers):
            q, k, v = self._qkv(i, _rms(x, spec.norm_w, spec.eps), cos, sin)
            if ragged:
                self.cache.k[i, write_slots, :, write_pos] = k[real_r, :, real_t]
                self.cache.v[i, write_slots, :, write_pos] = v[real_r, :, real_t]
            else:
                self.cache.k[i, slots, :, start:span] = k
                self.cache.v[i, slots, :, start:span] = v
            if start or ragged:
                k, v = self.cache.k[i, slots, :, :span], self.cache.v[i, slots, :, :span]
            if i == len(self._layers) - 1:
                q, x = q[rows, :, last][:, :, None], x[rows, last][:, None]  # [n, H, 1, D], [n, 1, hid]
                masks = self._row_masks(start_t + last, span, x.dtype)
            attn = sink_attention(q, k, v, spec.sinks, masks[spec.sliding])
            x = self._block_tail(i, x, attn)
        return self._logits(x[:, 0])

    def prefix(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values ``[layers, kv_heads, P, head_dim]`` (each) of one token prefix ``[P]``.

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
            keys.append(k[0])
            values.append(v[0])
            if i < len(self._layers) - 1:  # the last layer's output is never read
                x = self._block_tail(i, x, sink_attention(q, k, v, spec.sinks, masks[spec.sliding]))
        return torch.stack(keys), torch.stack(values)

    def load_prefix(self, kv: tuple[torch.Tensor, torch.Tensor], slots: torch.Tensor) -> None:
        """Copy cached keys and values ``[layers, kv_heads, P, head_dim]`` (a :meth:`prefix` result, or a finished
        conversation's) into positions ``0 .. P-1`` of cache ``slots`` ``[n]``."""
        k, v = kv
        p = k.shape[2]
        self.cache.k[:, slots, :, :p] = k[:, None]
        self.cache.v[:, slots, :, :p] = v[:, None]

    def move(self, src: int, dst: int, positions: int) -> None:
        """Copy cache slot ``src``'s keys/values at positions ``0 .. positions-1`` into slot ``dst``."""
        self.cache.k[:, dst, :, :positions] = self.cache.k[:, src, :, :positions]
        self.cache.v[:, dst, :, :positions] = self.cache.v[:, src, :, :positions]

    def decode(self, tokens: torch.Tensor, positions: list[int], slots: list[int]) -> torch.Tensor:
        """One token per row: ids ``[B]`` at host ``positions`` into cache ``slots`` (both length ``B``).

        Returns fp32 logits ``[B, V]`` for the next position of each row. Keys are read over
        ``[start, max(pos)]``: ``start = 0`` on full layers and ``min(pos) - window + 1`` on sliding ones
        (no row sees further back), so sliding layers cost O(window), not O(length). When the slots are one
        contiguous run (the usual case: slots are handed out lowest-first) keys are a view, not a gather.
        """
        b, span = tokens.shape[0], max(positions) + 1
        heads, kv = self.heads, self.kv_heads
        pos, slot_t = torch.tensor(positions, device=self.device), torch.tensor(slots, device=self.device)
        x = F.embedding(tokens, self.model.model.embed_tokens.weight)  # [B, hidden]
        cos, sin = self._rope_tables(x, pos)  # [B, 1, D]
        masks = self._row_masks(pos, span, x.dtype)
        starts = {False: 0, True: max(0, min(positions) - self.window + 1)}
        lo = slots[0]
        rows: slice | torch.Tensor = slice(lo, lo + b) if slots == list(range(lo, lo + b)) else slot_t
        for i, layer in enumerate(self._layers):
            qkv = F.linear(_rms(x, layer.norm_w, layer.eps), layer.qkv_w, layer.qkv_b).view(b, -1, self.head_dim)
            qk = _rope(qkv[:, : heads + kv], cos, sin)  # [B, H + KVH, D]
            ck, cv = self.cache.k[i], self.cache.v[i]
            ck[slot_t, :, pos] = qk[:, heads:]
            cv[slot_t, :, pos] = qkv[:, heads + kv :]
            start = starts[layer.sliding]
            keys, values = ck[rows, :, start:span], cv[rows, :, start:span]
            mask = masks[layer.sliding][..., start:]
            attn = sink_attention(qk[:, :heads, None], keys, values, layer.sinks, mask)  # [B, H, 1, D]
            x = x + F.linear(attn.view(b, -1), layer.o_w, layer.o_b)
            x = x + dense_moe(layer.mlp, layer.dense, _rms(x, layer.post_w, layer.eps))
        return self._logits(x)


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """An HF RMSNorm (fp32 ``weight``, ``eps``) as one fused op instead of ~7 eager ones."""
    return F.rms_norm(x.float(), (x.shape[-1],), weight, eps).to(x.dtype)


def _additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Boolean mask → additive mask (0 where allowed, -inf elsewhere)."""
    zeros = torch.zeros((), dtype=dtype, device=allowed.device)
    return torch.where(allowed, zeros, torch.tensor(float("-inf"), dtype=dtype, device=allowed.device))
