"""The engine's attention against transformers' GPT-OSS ``eager_attention_forward`` (the trainer's math)."""

from __future__ import annotations

import types

import pytest
import torch
from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

from harmonyrl.engine.local.forward import EAGER_MAX_QUERIES, sink_attention

B, H, KVH, D, S = 5, 4, 2, 32, 40


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("queries", [1, 4, EAGER_MAX_QUERIES + 8])  # decode, a short continued tail, prefill
def test_sink_attention_is_hf_eager(dtype: torch.dtype, queries: int) -> None:
    """bf16 bit for bit on the eager paths (HF's max shift, rounded to bf16, must stay in the op order);
    fp32 to a few ulps (the engine folds the query group instead of copying keys: other GEMM shapes)."""
    g = torch.Generator().manual_seed(queries)
    q = torch.randn(B, H, queries, D, generator=g).to(dtype)
    k, v = (torch.randn(B, KVH, S, D, generator=g).to(dtype) for _ in range(2))
    sinks = torch.randn(H, generator=g).to(dtype)
    q_pos = torch.tensor([39, 20, 25, 39, 30])[:, None] - torch.arange(queries).flip(0)  # [B, T], last = row end
    allowed = torch.arange(S)[None, None] <= q_pos[..., None]
    mask = torch.where(allowed, 0.0, float("-inf")).to(dtype).view(B, 1, queries, S)
    module = types.SimpleNamespace(num_key_value_groups=H // KVH, sinks=sinks, training=False)
    with torch.inference_mode():
        want, _ = eager_attention_forward(module, q, k, v, mask, D**-0.5)
        got = sink_attention(q, k, v, sinks, mask).transpose(1, 2)
    if dtype == torch.bfloat16 and queries <= EAGER_MAX_QUERIES:
        assert torch.equal(got, want)
    else:
        tol = 1e-6 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=0)
