"""The fused sink kernel equals transformers' eager GPT-OSS attention in forward and backward (sinks included);
the sink-less kernel is measurably different (it exists to reproduce the mismatch bug)."""

from __future__ import annotations

import pytest
import torch

from harmonyrl.learn.batch import _forward
from harmonyrl.models.attention import KERNELS, set_kernel, sink_sdpa
from harmonyrl.models.tiny_gpt_oss import build_config, build_model

VOCAB = 97


def _model() -> torch.nn.Module:
    model = build_model(build_config("nano", VOCAB, 0, 1), seed=0)
    with torch.no_grad():  # fresh sinks are ~0; make them matter
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_(0.0, 1.5)
    return model


def _ids() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, VOCAB, (3, 50), generator=g)  # 50 > nano's 32-token sliding window
    attn = torch.ones_like(ids)
    attn[1, 41:] = 0  # right padding
    return ids, attn


def _logits_and_grads(model: torch.nn.Module, kernel: str) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    set_kernel(model, kernel)  # type: ignore[arg-type]
    model.zero_grad(set_to_none=True)
    ids, attn = _ids()
    logits = model(input_ids=ids, attention_mask=attn).logits
    (torch.log_softmax(logits, -1)[..., 7] * attn).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logits.detach(), grads


def test_fused_sink_kernel_equals_eager_forward_and_backward() -> None:
    model = _model()
    ref, ref_grads = _logits_and_grads(model, "eager")
    out, grads = _logits_and_grads(model, "harmonyrl_sink_sdpa")
    real = _ids()[1].bool()
    assert torch.allclose(out[real], ref[real], atol=1e-5)
    assert ref_grads.keys() == grads.keys() and any("sinks" in n for n in grads)
    for name, g in ref_grads.items():
        assert torch.allclose(grads[name], g, atol=1e-5 * max(1.0, g.abs().max().item())), name


def test_sinkless_kernel_is_wrong_by_design() -> None:
    model = _model()
    ref, _ = _logits_and_grads(model, "eager")
    out, grads = _logits_and_grads(model, "harmonyrl_sinkless")
    real = _ids()[1].bool()
    assert (out[real] - ref[real]).abs().max() > 1e-2
    assert not any("sinks" in n for n in grads)  # the sinks take no part


def test_fused_kernel_with_the_shared_prefix_cache_path() -> None:
    model = _model()
    g = torch.Generator().manual_seed(2)
    head = torch.randint(1, VOCAB, (40,), generator=g)
    ids = torch.stack([torch.cat([head, torch.randint(1, VOCAB, (n,), generator=g)]) for n in (12, 12, 12)])
    attn = torch.ones_like(ids)
    set_kernel(model, "eager")
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=attn).logits
    set_kernel(model, "harmonyrl_sink_sdpa")
    with torch.no_grad():
        out = _forward(model, ids, attn)[0]
    assert torch.allclose(out, ref, atol=1e-5)


def test_gqa_heads_keep_their_own_sinks() -> None:
    # 4 query heads on 2 KV heads; different sinks per query head must give different outputs
    q, k, v = torch.randn(1, 4, 5, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    q[:, 1] = q[:, 0]  # heads 0 and 1 share KV head 0 and have identical queries
    out = sink_sdpa(q, k, v, torch.tensor([-5.0, 5.0, 0.0, 0.0]), None, scale=8**-0.5)
    assert not torch.allclose(out[:, 0], out[:, 1])  # a large sink shrinks head 1's output
    assert out[:, 1].abs().max() < out[:, 0].abs().max()


def test_unknown_kernel_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="choose from"):
        set_kernel(_model(), "flash9")  # type: ignore[arg-type]
    assert "eager" in KERNELS


def _eager(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """transformers' eager GPT-OSS attention with its own additive mask convention, as ``[B, H, T, D]``."""
    from types import SimpleNamespace

    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    module = SimpleNamespace(num_key_value_groups=q.shape[1] // k.shape[1], sinks=sinks, training=True)
    bias = torch.zeros(keep.shape).masked_fill(~keep, torch.finfo(torch.float32).min)
    out, _ = eager_attention_forward(module, q, k, v, bias, scaling=q.shape[-1] ** -0.5)  # type: ignore[arg-type]
    return out.transpose(1, 2)


@pytest.mark.parametrize("window", [None, 40])
@pytest.mark.parametrize("padding", ["none", "left", "right"])
def test_chunked_flash_path_equals_eager_with_all_gradients(window: int | None, padding: str) -> None:
    # 300 queries = 3 chunks of QUERY_CHUNK; left padding leaves whole query rows (and a chunk) seeing no key
    from harmonyrl.models import attention

    assert attention.fused.QUERY_CHUNK < 300 / 2
    b, h, kvh, t, d = 2, 4, 2, 300, 16
    g = torch.Generator().manual_seed(3)
    leaves = [
        torch.randn(*shape, generator=g, requires_grad=True) for shape in [(b, h, t, d), (b, kvh, t, d), (b, kvh, t, d)]
    ]
    sinks = (torch.randn(h, generator=g) * 2).requires_grad_()
    pos = torch.arange(t)
    keep = pos[None, :] <= pos[:, None]
    if window is not None:
        keep &= pos[:, None] - pos[None, :] < window
    keep = keep[None, None].repeat(b, 1, 1, 1)
    if padding == "left":
        keep[1, ..., :150] = False  # keys 0..149 of row 1 are padding: its first 150 queries see nothing
    elif padding == "right":
        keep[0, ..., 260:] = False
    weights = torch.randn(b, h, t, d, generator=g)
    results = []
    for fn in (_eager, lambda q, k, v, s, m: attention.sink_sdpa(q, k, v, s, m, scale=d**-0.5)):
        out = fn(*leaves, sinks, keep)
        grads = torch.autograd.grad((out * weights).sum(), [*leaves, sinks])
        results.append((out, grads))
    (ref, ref_grads), (out, grads) = results
    assert torch.allclose(out, ref, atol=1e-5)
    if padding == "left":
        assert out[1, :, :150].abs().max() == 0  # the sink takes all the weight, no NaN
    for name, gr, gref in zip(["q", "k", "v", "sinks"], grads, ref_grads, strict=True):
        assert torch.allclose(gr, gref, atol=1e-5 * max(1.0, gref.abs().max().item())), name


def test_causal_path_without_mask_equals_eager() -> None:
    # HF hands no mask to a purely causal layer; the kernel then runs one is_causal flash call
    from harmonyrl.models import attention

    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 8, 200, 16, generator=g, requires_grad=True) for _ in range(3))
    sinks = torch.randn(8, generator=g, requires_grad=True)
    keep = torch.ones(200, 200, dtype=torch.bool).tril()[None, None]
    ref = _eager(q, k, v, sinks, keep)
    out = attention.sink_sdpa(q, k, v, sinks, None, scale=16**-0.5, causal=True)
    assert torch.allclose(out, ref, atol=1e-5)
    ref_grads = torch.autograd.grad(ref.sum(), [q, k, v, sinks])
    grads = torch.autograd.grad(out.sum(), [q, k, v, sinks])
    for gr, gref in zip(grads, ref_grads, strict=True):
        assert torch.allclose(gr, gref, atol=1e-5 * max(1.0, gref.abs().max().item()))
    portable = attention.fused._augmented_sdpa(q, k, v, sinks, keep, 16**-0.5)  # the non-CPU route stays exact too
    assert torch.allclose(portable, ref, atol=1e-5)


def test_thread_invariant_eager_is_eager_in_the_forward_and_close_in_the_backward() -> None:
    model = _model()
    ref, ref_grads = _logits_and_grads(model, "eager")
    out, grads = _logits_and_grads(model, "harmonyrl_eager")
    assert torch.equal(out, ref)  # the same operations: bit for bit
    assert ref_grads.keys() == grads.keys() and any("sinks" in n for n in grads)
    for name, g in ref_grads.items():
        assert torch.allclose(grads[name], g, atol=1e-6 * max(1.0, g.abs().max().item())), name


@pytest.mark.parametrize("kernel", ["eager", "harmonyrl_eager"])
def test_chunked_eager_twins_equal_their_kernel_with_all_gradients(
    kernel: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 7 query rows per chunk: 50 positions make 8 chunks; sliding window (32) and right padding come from HF's masks
    from harmonyrl.models import attention

    monkeypatch.setattr(attention.eager, "EAGER_CHUNK_ELEMENTS", 3 * 4 * 7 * 51)
    torch.manual_seed(0)
    model = _model()
    ref, ref_grads = _logits_and_grads(model, kernel)
    out, grads = _logits_and_grads(model, attention.CHUNKED_EAGER[kernel])
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-6)
    assert ref_grads.keys() == grads.keys() and any("sinks" in n for n in grads)
    for name, g in ref_grads.items():
        assert torch.allclose(grads[name], g, atol=1e-6 * max(1.0, g.abs().max().item())), name


@pytest.mark.parametrize("padding", ["none", "left"])
def test_chunked_eager_rows_equal_eager_where_rows_see_nothing(padding: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # left padding: the first queries of row 1 see no key at all; eager gives them 0 (the sink takes everything)
    from types import SimpleNamespace

    from harmonyrl.models import attention

    monkeypatch.setattr(attention.eager, "EAGER_CHUNK_ELEMENTS", 2 * 4 * 16 * 61)  # 16 rows per chunk
    b, h, kvh, t, d = 2, 4, 2, 60, 8
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(b, n, t, d, generator=g, requires_grad=True) for n in (h, kvh, kvh))
    sinks = (torch.randn(h, generator=g) * 2).requires_grad_()
    keep = torch.ones(t, t, dtype=torch.bool).tril()[None, None].repeat(b, 1, 1, 1)
    if padding == "left":
        keep[1, ..., :20] = False
    ref = _eager(q, k, v, sinks, keep)
    module = SimpleNamespace(num_key_value_groups=h // kvh, sinks=sinks, training=False)
    chunked = attention.eager.chunked_eager(attention.eager.torch_softmax)
    out = chunked(module, q, k, v, None if padding == "none" else keep, d**-0.5)[0].transpose(1, 2)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-6)
    if padding == "left":
        assert out[1, :, :20].abs().max() == 0
    weights = torch.randn(b, h, t, d, generator=g)
    ref_grads = torch.autograd.grad((ref * weights).sum(), [q, k, v, sinks])
    grads = torch.autograd.grad((out * weights).sum(), [q, k, v, sinks])
    for name, gr, gref in zip(["q", "k", "v", "sinks"], grads, ref_grads, strict=True):
        assert torch.allclose(gr, gref, atol=1e-6 * max(1.0, gref.abs().max().item())), name


def test_chunked_eager_with_the_shared_prefix_cache_path(monkeypatch: pytest.MonkeyPatch) -> None:
    # the tail's queries sit after the cached prefix's keys (T != S, no mask from HF): causal rows aligned right
    from harmonyrl.models import attention

    monkeypatch.setattr(attention.eager, "EAGER_CHUNK_ELEMENTS", 3 * 4 * 5 * 53)
    model = _model()
    g = torch.Generator().manual_seed(2)
    head = torch.randint(1, VOCAB, (40,), generator=g)
    ids = torch.stack([torch.cat([head, torch.randint(1, VOCAB, (12,), generator=g)]) for _ in range(3)])
    attn = torch.ones_like(ids)
    set_kernel(model, "eager")
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=attn).logits
    set_kernel(model, "harmonyrl_eager_chunked")
    with torch.no_grad():
        out = _forward(model, ids, attn)[0]
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-6)


def _largest_tensor(model: torch.nn.Module, ids: torch.Tensor) -> int:
    """Elements of the largest tensor any op makes in a forward and backward of ``model`` on ``ids``."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Largest(TorchDispatchMode):
        most = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            out = func(*args, **(kwargs or {}))
            for x in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(x, torch.Tensor):
                    Largest.most = max(Largest.most, x.numel())
            return out

    with Largest():
        model(input_ids=ids).logits.sum().backward()
    return Largest.most


def test_chunked_eager_never_forms_the_whole_score_tensor(monkeypatch: pytest.MonkeyPatch) -> None:
    # 4 heads x 300 x 301 scores (361,200 elements) in eager; chunks of 20 query rows in the twin; nothing else in
    # the nano model's pass comes near (the largest, an MoE buffer, is 300 x 256)
    from harmonyrl.models import attention

    monkeypatch.setattr(attention.eager, "EAGER_CHUNK_ELEMENTS", 4 * 20 * 301)
    model = _model()
    ids = torch.randint(1, VOCAB, (1, 300), generator=torch.Generator().manual_seed(0))
    set_kernel(model, "eager")
    assert _largest_tensor(model, ids) >= 4 * 300 * 301
    set_kernel(model, "harmonyrl_eager_chunked")
    assert _largest_tensor(model, ids) < 4 * 300 * 301 // 4
