"""A lean, KV-cached forward pass over a ``GptOssForCausalLM``'s own modules, for the embedded engine.

Why not call the HF model with a ``DynamicCache``? Per-step Python overhead (mask builders, cache objects,
output dataclasses) dominates at our model sizes, and the HF cache cannot hold rows of different lengths
that join and leave between steps. This module reuses the HF parameters and the HF ``mlp`` modules (so MoE
routing is the trainer's, token for token) and re-implements only attention around a preallocated cache:

* cache ``k``/``v``: ``[layers, slots, kv_heads, max_seq_len, head_dim]``; a slot is one in-flight request.
* prefill: newly admitted prompts, right-padded to ``[n, T]``; every prompt starts at position 0, so one
  ``[T, T]`` causal (or sliding-window) mask serves all rows; padded queries compute garbage that is
  never read (valid queries never see a padded key: it lies in their future).
* decode: one token per active row at per-row positions ``[B]``; keys ``0..max(pos)`` of each row's slot,
  masked per row. The MoE of a decode step runs as :func:`dense_moe` (same router module, same routing).

The attention math lives in :func:`sink_attention` alone, so a faster kernel can replace it.
"""

from __future__ import annotations

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


def dense_moe(mlp: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The GPT-OSS MoE block on few tokens ``x`` ``[N, hidden]`` → ``[N, hidden]``, all experts densely.

    Routing comes from the layer's own ``router`` module, so expert choice and weights are the trainer's.
    The expert math is HF's (interleaved gate/up, clamped SwiGLU, biases) but as two batched GEMMs over all
    ``E`` experts with non-selected experts weighted 0 (``0 * finite == 0`` and two-term sums commute, so
    the mixture matches the sparse path). For a decode step (N = batch) this is ~2x cheaper than HF's
    sort/histc/grouped_mm dispatch; for prefill (N large) the layer's ``mlp`` module is used instead.
    """
    ex = mlp.experts
    _, scores, idx = mlp.router(x)
    weights = torch.zeros(x.shape[0], ex.num_experts, dtype=x.dtype).scatter_(1, idx, scores)
    h = x.expand(ex.num_experts, *x.shape)
    gate_up = torch.baddbmm(ex.gate_up_proj_bias[:, None, :], h, ex.gate_up_proj)  # [E, N, 2I]
    out = torch.baddbmm(ex.down_proj_bias[:, None, :], ex._apply_gate(gate_up), ex.down_proj)  # [E, N, hid]
    return (out * weights.T[:, :, None]).sum(0)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate halves of ``x`` ``[B, heads, T, D]`` by ``cos``/``sin`` ``[B, 1, T, D/2]`` (HF GPT-OSS RoPE)."""
    first, second = torch.chunk(x, 2, dim=-1)
    return torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)


class KVCache:
    """Preallocated keys/values ``[layers, slots, kv_heads, max_seq_len, head_dim]`` (zeros, never NaN,
    so masked stale entries contribute exactly 0 to attention)."""

    def __init__(self, layers: int, slots: int, kv_heads: int, max_seq_len: int, head_dim: int,
                 dtype: torch.dtype) -> None:
        shape = (layers, slots, kv_heads, max_seq_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype)
        self.v = torch.zeros(shape, dtype=dtype)


class LeanForward:
    """Prefill / decode over the parameters of ``model`` (which the caller owns and keeps private).

    Call :meth:`refresh` after the model's weights change: q/k/v projections are fused into one matrix
    ``[(H + 2·KVH)·D, hidden]`` here (one GEMM instead of three per layer).
    """

    def __init__(self, model: GptOssForCausalLM, max_batch: int, max_seq_len: int) -> None:
        cfg = model.config
        self.model = model
        self.layers = list(model.model.layers)
        self.heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.window = int(cfg.sliding_window or max_seq_len)
        self.sliding = [t == "sliding_attention" for t in cfg.layer_types]
        dtype = model.lm_head.weight.dtype
        self.cache = KVCache(len(self.layers), max_batch, self.kv_heads, max_seq_len, self.head_dim, dtype)
        self.qkv_w: list[torch.Tensor] = []
        self.qkv_b: list[torch.Tensor | None] = []
        self.refresh()

    def refresh(self) -> None:
        """Rebuild the fused q/k/v weights from the model's current parameters."""
        self.qkv_w, self.qkv_b = [], []
        for layer in self.layers:
            att = layer.self_attn
            self.qkv_w.append(torch.cat([att.q_proj.weight, att.k_proj.weight, att.v_proj.weight]).detach())
            biases = [att.q_proj.bias, att.k_proj.bias, att.v_proj.bias]
            self.qkv_b.append(None if biases[0] is None else torch.cat(biases).detach())  # type: ignore[arg-type]

    def _qkv(self, i: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Normed hidden ``x`` ``[B, T, hidden]`` → roped q ``[B, H, T, D]``, roped k and v ``[B, KVH, T, D]``."""
        b, t, _ = x.shape
        qkv = F.linear(x, self.qkv_w[i], self.qkv_b[i]).view(b, t, -1, self.head_dim).transpose(1, 2)
        q, k, v = qkv.split([self.heads, self.kv_heads, self.kv_heads], dim=1)
        return _rope(q, cos, sin), _rope(k, cos, sin), v

    def _block_tail(self, i: int, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Output projection, residual, then the MoE on ``[B, T, hidden]`` (see :func:`dense_moe`)."""
        layer = self.layers[i]
        b, _, t, _ = attn.shape
        x = x + layer.self_attn.o_proj(attn.transpose(1, 2).reshape(b, t, -1))
        normed = layer.post_attention_layernorm(x)
        if t == 1:
            return x + dense_moe(layer.mlp, normed.view(b, -1)).view(b, 1, -1)
        moe, _ = layer.mlp(normed)
        return x + moe

    def _rope_tables(self, x: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin ``[B, 1, T, D/2]`` from the model's own ``rotary_emb`` at per-row positions ``[B, T]``."""
        cos, sin = self.model.model.rotary_emb(x, pos)
        return cos.unsqueeze(1), sin.unsqueeze(1)

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        """Final norm + LM head on last hidden states ``[B, hidden]`` → fp32 logits ``[B, V]``."""
        return self.model.lm_head(self.model.model.norm(h)).float()

    def prefill(self, tokens: torch.Tensor, lengths: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """Run right-padded prompts ``[n, T]`` (true ``lengths`` ``[n]``) into cache ``slots`` ``[n]``.

        Returns fp32 logits ``[n, V]`` at each prompt's last real token (the first sampled position).
        """
        n, t = tokens.shape
        pos = torch.arange(t).expand(n, t)
        x = self.model.model.embed_tokens(tokens)
        cos, sin = self._rope_tables(x, pos)
        q_idx, k_idx = torch.arange(t)[:, None], torch.arange(t)[None, :]
        causal = k_idx <= q_idx
        masks = {  # [1, 1, T, T]: every prompt starts at position 0, so one mask serves all rows
            False: _additive(causal, x.dtype).view(1, 1, t, t),
            True: _additive(causal & (k_idx > q_idx - self.window), x.dtype).view(1, 1, t, t),
        }
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(i, layer.input_layernorm(x), cos, sin)
            self.cache.k[i, slots, :, :t] = k
            self.cache.v[i, slots, :, :t] = v
            attn = sink_attention(q, k, v, layer.self_attn.sinks, masks[self.sliding[i]])
            x = self._block_tail(i, x, attn)
        return self._logits(x[torch.arange(n), lengths - 1])

    def decode(self, tokens: torch.Tensor, pos: torch.Tensor, slots: torch.Tensor, span: int) -> torch.Tensor:
        """One token per row: ids ``[B]`` at positions ``pos`` ``[B]`` into cache ``slots`` ``[B]``.

        ``span`` = ``max(pos) + 1`` (passed in from host bookkeeping, avoiding a device sync). Returns fp32
        logits ``[B, V]`` for the next position of each row.
        """
        b = tokens.shape[0]
        x = self.model.model.embed_tokens(tokens)[:, None, :]
        cos, sin = self._rope_tables(x, pos[:, None])
        k_pos, q_pos = torch.arange(span)[None, :], pos[:, None]
        full = k_pos <= q_pos
        masks = {
            False: _additive(full, x.dtype).view(b, 1, 1, span),
            True: _additive(full & (k_pos > q_pos - self.window), x.dtype).view(b, 1, 1, span),
        }
        lo = int(slots[0])
        contiguous = bool((slots == torch.arange(lo, lo + b)).all())
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(i, layer.input_layernorm(x), cos, sin)
            ck, cv = self.cache.k[i], self.cache.v[i]
            ck[slots, :, pos] = k[:, :, 0]
            cv[slots, :, pos] = v[:, :, 0]
            if contiguous:
                keys, values = ck[lo : lo + b, :, :span], cv[lo : lo + b, :, :span]
            else:
                keys, values = ck[slots, :, :span], cv[slots, :, :span]
            attn = sink_attention(q, keys, values, layer.self_attn.sinks, masks[self.sliding[i]])
            x = self._block_tail(i, x, attn)
        return self._logits(x[:, 0])


def _additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Boolean mask → additive mask (0 where allowed, -inf elsewhere)."""
    zeros = torch.zeros((), dtype=dtype)
    return torch.where(allowed, zeros, torch.tensor(float("-inf"), dtype=dtype))
