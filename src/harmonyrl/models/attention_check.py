"""Exactness of the flex sink kernel (``harmonyrl_flex_sink``) against transformers' eager GPT-OSS attention, on any
device: the forward on the CPU in the default suite, forward *and* every gradient (q, k, v, sinks) on CUDA, where
flex has its backward (``tests/models/test_attention_flex.py``, ``benchmarks/attention_gpu.py --check``).

Each :class:`Case` is one attention call as ``GptOssAttention`` makes it: the block mask comes from the kernel's
own mask builder fed transformers' mask functions (causal, sliding window) and a 2D padding mask, with the query
offset a cache gives; the eager reference gets a dense mask built independently from positions. Criteria:

* fp32: ``|flex − eager| ≤ 1e-5`` for the output, ``≤ 1e-5 · max(1, max|eager|)`` for each gradient (relative
  for gradients whose scale is above 1, as the CPU kernels' tests measure them).
* bf16: both kernels run in bf16 and are measured against eager in fp64 on the same (bf16) inputs; flex passes when
  its error is within bf16 rounding: at most twice eager-bf16's own error, or ``2⁻⁷ · max(1, max|ref|)`` (one bf16
  epsilon of the largest value) if that is larger.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Literal

import torch
from transformers.masking_utils import causal_mask_function, sliding_window_causal_mask_function
from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

from harmonyrl.models.attention import flex_block_mask, flex_sink

Padding = Literal["none", "left", "right"]


@dataclass(frozen=True)
class Case:
    """One attention call: ``t`` queries after ``offset`` cached positions (keys ``offset + t``)."""

    name: str
    heads: int
    kv_heads: int
    head_dim: int
    t: int
    window: int | None = None
    padding: Padding = "none"
    offset: int = 0
    batch: int = 2


CASES: tuple[Case, ...] = (
    Case("causal_gqa_300", 4, 2, 16, 300),  # 300: not a multiple of flex's 128-token blocks
    Case("window40_leftpad", 4, 2, 16, 300, window=40, padding="left"),  # rows that see no key at all
    Case("causal_rightpad", 4, 2, 16, 200, padding="right"),
    Case("window40_cached_prefix", 4, 2, 16, 100, window=40, offset=150),  # the shared-prefix pass: T != S
    Case("heads6_not_pow2", 6, 2, 16, 130, window=64),  # GQA through repeated KV heads
    Case("gptoss20b_heads_window128", 64, 8, 64, 640, window=128, batch=1),
)
"""The default cases: small enough for eager on a CPU (forward) and for every dtype on a GPU in seconds."""


def _keep(case: Case) -> torch.Tensor:
    """Dense boolean ``[B, 1, T, S]`` "may attend", from positions (independent of transformers' mask functions)."""
    s = case.offset + case.t
    q = torch.arange(case.offset, s)[:, None]
    k = torch.arange(s)[None, :]
    keep = k <= q
    if case.window is not None:
        keep &= q - k < case.window
    keep = keep[None, None].repeat(case.batch, 1, 1, 1)
    keep &= _padding(case)[:, None, None, :]
    return keep


def _padding(case: Case) -> torch.Tensor:
    """2D ``[B, S]`` attention mask (True: a real token) as the trainer passes it."""
    s = case.offset + case.t
    pad = torch.ones(case.batch, s, dtype=torch.bool)
    if case.padding == "left":
        pad[-1, : s // 2] = False  # the last row's first half is padding: its first queries see nothing
    elif case.padding == "right":
        pad[0, s - s // 5 :] = False
    return pad


def _eager(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """transformers' eager GPT-OSS attention with its additive mask (0 / the dtype's minimum) → ``[B, H, T, D]``."""
    module = SimpleNamespace(num_key_value_groups=q.shape[1] // k.shape[1], sinks=sinks, training=True)
    bias = torch.zeros(keep.shape, dtype=q.dtype, device=q.device).masked_fill(~keep, torch.finfo(q.dtype).min)
    out: torch.Tensor = eager_attention_forward(module, q, k, v, bias, scaling=q.shape[-1] ** -0.5)[0]  # type: ignore[arg-type]
    return out.transpose(1, 2)


def _flex(case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    s = case.offset + case.t
    fn = causal_mask_function if case.window is None else sliding_window_causal_mask_function(case.window)
    pad = _padding(case).to(q.device)
    block_mask = flex_block_mask(
        batch_size=case.batch,
        q_length=case.t,
        kv_length=s,
        q_offset=case.offset,
        kv_offset=0,
        mask_function=fn,
        attention_mask=None if bool(pad.all()) else pad,
        device=q.device,
    )
    return flex_sink(q, k, v, sinks, block_mask, q.shape[-1] ** -0.5)


def _inputs(case: Case, device: torch.device, dtype: torch.dtype) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    b, s, d = case.batch, case.offset + case.t, case.head_dim
    shapes = [(b, case.heads, case.t, d), (b, case.kv_heads, s, d), (b, case.kv_heads, s, d), (case.heads,)]
    scales = [1.0, 1.0, 1.0, 2.0]  # sinks ~ N(0, 4): some heads give the sink most of the mass
    return [
        (torch.randn(*sh, generator=g) * sc).to(device=device, dtype=dtype)
        for sh, sc in zip(shapes, scales, strict=True)
    ]


def _run(
    fn: Any, leaves: list[torch.Tensor], keep: torch.Tensor, weights: torch.Tensor, backward: bool
) -> list[torch.Tensor]:
    """Output and (with ``backward``) the gradients of ``Σ out · weights`` for q, k, v and the sinks, as fp64."""
    xs = [x.detach().clone().requires_grad_(backward) for x in leaves]
    with torch.set_grad_enabled(backward):
        out = fn(*xs, keep)
        if not backward:
            return [out.double()]
        grads = torch.autograd.grad((out.double() * weights).sum(), xs)
    return [out.detach().double(), *(g.double() for g in grads)]


QUANTITIES = ("out", "dq", "dk", "dv", "dsinks")


def check_flex_sink(
    device: str | torch.device,
    dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16),
    backward: bool = True,
    cases: tuple[Case, ...] = CASES,
) -> list[dict[str, Any]]:
    """One record per (case, dtype, quantity): ``err`` (max abs flex − reference), ``tol``, ``ok``, and for bf16
    ``eager_err`` (eager-bf16's own error against fp64). ``backward=False`` checks the output only (the CPU)."""
    device = torch.device(device)
    records: list[dict[str, Any]] = []
    for case in cases:
        keep = _keep(case).to(device)
        weights = torch.randn(case.batch, case.heads, case.t, case.head_dim, generator=torch.Generator().manual_seed(1))
        weights = weights.to(device=device, dtype=torch.float64)
        for dtype in dtypes:
            leaves = _inputs(case, device, dtype)
            ours = _run(lambda q, k, v, sk, m, c=case: _flex(c, q, k, v, sk), leaves, keep, weights, backward)
            eager = _run(_eager, leaves, keep, weights, backward)
            exact = (
                eager if dtype == torch.float32 else _run(_eager, [x.double() for x in leaves], keep, weights, backward)
            )
            for name, mine, theirs, ref in zip(QUANTITIES[: len(ours)], ours, eager, exact, strict=True):
                scale = max(1.0, float(ref.abs().max()))
                err = float((mine - ref).abs().max())
                record: dict[str, Any] = {
                    "case": case.name,
                    "dtype": str(dtype).removeprefix("torch."),
                    "quantity": name,
                }
                if dtype == torch.float32:
                    tol = 1e-5 if name == "out" else 1e-5 * scale
                else:
                    eager_err = float((theirs - ref).abs().max())
                    tol = max(2 * eager_err, 2**-7 * scale)
                    record["eager_err"] = eager_err
                record.update(err=err, tol=tol, ok=err <= tol)
                records.append(record)
    return records


def summary(records: list[dict[str, Any]]) -> str:
    """One line per record, for logs."""
    lines = []
    for r in records:
        extra = f" eager_err={r['eager_err']:.3g}" if "eager_err" in r else ""
        flag = "ok" if r["ok"] else "FAIL"
        lines.append(f"{flag} {r['case']} {r['dtype']} {r['quantity']}: err={r['err']:.3g} tol={r['tol']:.3g}{extra}")
    return "\n".join(lines)
