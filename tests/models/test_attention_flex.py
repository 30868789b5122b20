"""The flex sink kernel (``harmonyrl_flex_sink``, the CUDA training kernel) equals transformers' eager GPT-OSS
attention: the forward here on the CPU (kernel cases and the nano model, with sliding windows, padding, GQA and the
shared-prefix pass), the sink merge's gradients here with a differentiable stand-in for flex, and flex's own
backward on CUDA only (torch refuses it on the CPU), where the last test runs :func:`check_flex_sink`. The config
and trainer imports stay inside their tests: the GPU machine has no pydantic, and ``pytest -m gpu`` must import
this file there."""

from __future__ import annotations

from typing import get_args

import pytest
import torch

from harmonyrl.models.attention import CUDA_TRAINING_ONLY, FLEX_KERNEL, KERNELS, merge_sink, set_kernel
from harmonyrl.models.attention_check import CASES, check_flex_sink, summary
from harmonyrl.models.tiny_gpt_oss import build_config, build_model

VOCAB = 97


def _failures(records: list[dict[str, object]]) -> str:
    return summary([r for r in records if not r["ok"]])


def test_flex_forward_equals_eager_on_cpu_every_case() -> None:
    records = check_flex_sink("cpu", backward=False)
    assert len(records) == 2 * len(CASES)
    assert all(r["ok"] for r in records), _failures(records)
    assert max(float(r["err"]) for r in records if r["dtype"] == "float32") < 1e-5  # type: ignore[arg-type]


def _model() -> torch.nn.Module:
    model = build_model(build_config("nano", VOCAB, 0, 1), seed=0)
    with torch.no_grad():  # fresh sinks are ~0; make them matter
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_(0.0, 1.5)
    return model


def test_nano_model_forward_equals_eager_with_window_and_padding() -> None:
    model = _model()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, VOCAB, (3, 150), generator=g)  # > nano's 32-token window and one 128-token flex block
    attn = torch.ones_like(ids)
    attn[1, 131:] = 0  # right padding
    attn[2, :20] = 0  # left padding
    logits = {}
    for kernel in ("eager", FLEX_KERNEL):
        set_kernel(model, kernel)
        with torch.no_grad():
            logits[kernel] = model(input_ids=ids, attention_mask=attn).logits
    real = attn.bool()
    assert (logits[FLEX_KERNEL][real] - logits["eager"][real]).abs().max() < 1e-5


def test_nano_model_shared_prefix_pass_equals_eager() -> None:
    # the tail's queries sit after the cached prefix's keys (T != S): the block mask carries transformers' offsets
    from harmonyrl.learn.batch import _forward

    model = _model()
    g = torch.Generator().manual_seed(2)
    head = torch.randint(1, VOCAB, (40,), generator=g)
    ids = torch.stack([torch.cat([head, torch.randint(1, VOCAB, (12,), generator=g)]) for _ in range(3)])
    attn = torch.ones_like(ids)
    set_kernel(model, "eager")
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=attn).logits
    set_kernel(model, FLEX_KERNEL)
    with torch.no_grad():
        out = _forward(model, ids, attn)[0]
    assert out is not None and (out - ref).abs().max() < 1e-5


def test_sink_merge_gradients_equal_eager() -> None:
    # flex's backward takes the gradients of its output and its lse; a differentiable dense stand-in gives the same
    # two, so this checks that autograd through out · σ(lse − sink) is the sink softmax's backward (rows that see
    # no key included: lse = -inf there)
    from harmonyrl.models.attention_check import _eager

    b, h, kvh, t, d = 2, 4, 2, 40, 8
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(b, n, t, d, generator=g, dtype=torch.float64, requires_grad=True) for n in (h, kvh, kvh))
    sinks = (torch.randn(h, generator=g, dtype=torch.float64) * 2).requires_grad_()
    keep = torch.ones(t, t, dtype=torch.bool).tril()[None, None].repeat(b, 1, 1, 1)
    keep[1, ..., :10] = False

    def stand_in(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
        scores = q @ k.repeat_interleave(h // kvh, 1).transpose(-1, -2) * d**-0.5
        scores = scores.masked_fill(~keep, float("-inf"))
        lse = scores.logsumexp(-1)
        probs = torch.where(keep, torch.exp(scores - lse.nan_to_num(neginf=0.0)[..., None]), 0.0)
        return merge_sink(probs @ v.repeat_interleave(h // kvh, 1), lse, sinks)

    weights = torch.randn(b, h, t, d, generator=g, dtype=torch.float64)
    ref = _eager(q, k, v, sinks, keep)
    out = stand_in(q, k, v, sinks)
    assert (out - ref).abs().max() < 1e-12
    assert out[1, :, :10].abs().max() == 0
    ref_grads = torch.autograd.grad((ref * weights).sum(), [q, k, v, sinks])
    grads = torch.autograd.grad((out * weights).sum(), [q, k, v, sinks])
    for name, gr, gref in zip(["q", "k", "v", "sinks"], grads, ref_grads, strict=True):
        assert not gr.isnan().any() and (gr - gref).abs().max() < 1e-10, name


def test_flex_kernel_names_the_missing_cpu_backward() -> None:
    model = _model()
    set_kernel(model, FLEX_KERNEL)
    ids = torch.randint(1, VOCAB, (1, 20), generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="no backward on the CPU"):
        model(input_ids=ids).logits.sum().backward()


def test_config_refuses_the_flex_kernel_for_a_cpu_trainer() -> None:
    from harmonyrl.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="trains on CUDA only") as err:
        load_config(overrides=["model.attention=harmonyrl_flex_sink", "device=cpu"])
    assert "\n" not in str(err.value)
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="torch sees no GPU"):
            load_config(overrides=["model.attention=harmonyrl_flex_sink"])


def test_config_names_every_kernel() -> None:
    from harmonyrl.config import ModelConfig
    from harmonyrl.config.model import CUDA_ONLY_ATTENTION

    assert get_args(ModelConfig.model_fields["attention"].annotation) == KERNELS
    assert CUDA_ONLY_ATTENTION == CUDA_TRAINING_ONLY


@pytest.mark.gpu  # deselected by default (CI has no GPU); the GPU check runs: pytest -m gpu
def test_flex_backward_equals_eager_on_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip(
            "NO GPU: the flex sink kernel's BACKWARD exactness is NOT checked on this machine (torch has no flex "
            "backward on the CPU); run it where there is one: pytest -m gpu, or benchmarks/attention_gpu.py --check"
        )
    records = check_flex_sink("cuda")
    assert all(r["ok"] for r in records), _failures(records)


def test_flex_always_runs_its_main_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """Compiled on the H200, inductor picked flex's decoding kernel for a 100-query call once shapes were dynamic
    and found no valid configuration (2026-11-29, docs/gpu.md): every call must ask for the main kernel."""
    from torch.nn.attention import flex_attention as flex_module

    from harmonyrl.models.attention import flex as flex_impl
    from harmonyrl.models.attention_check import CASES, check_flex_sink

    seen: list[dict[str, object]] = []
    real = flex_module.flex_attention

    def spy(*args: object, **kwargs: object) -> object:
        seen.append(kwargs)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(flex_module, "flex_attention", spy)
    short = next(c for c in CASES if c.t < 128)  # the cached-prefix case: fewer than 128 queries
    assert all(r["ok"] for r in check_flex_sink("cpu", backward=False, cases=(short,)))
    assert seen and all(k.get("kernel_options") == flex_impl.FLEX_KERNEL_OPTIONS for k in seen)
    assert flex_impl.FLEX_KERNEL_OPTIONS == {"FORCE_USE_FLEX_ATTENTION": True}
