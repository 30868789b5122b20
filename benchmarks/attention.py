"""Sink attention kernel vs transformers' eager GPT-OSS attention: forward + backward, time and peak memory.

What is measured: one attention call exactly as ``GptOssAttention`` makes it — ``q`` ``[1, H, T, D]``, ``k`` and
``v`` ``[1, KVH, T, D]``, the layer's sinks, the mask transformers builds for that kernel (eager: an additive
``[1, 1, T, T]`` float mask; ours: HF's sdpa mask, which is None for a full causal layer and a boolean band for
a sliding one) — then ``backward`` of a fixed random projection of the output, giving gradients for q, k, v
and the sinks. Ours is ``harmonyrl_sink_sdpa`` as registered with transformers' attention interface; eager is
``transformers.models.gpt_oss.modeling_gpt_oss.eager_attention_forward``. Batch 1, fp32, sequence lengths
512 / 1024 / 2048 / 4096, one sliding and one full layer, for two head layouts:

* ``micro`` — the default preset (4 query heads, 2 KV heads, head_dim 32, window 64);
* ``20b`` — gpt-oss-20b's attention (64 query heads, 8 KV heads, head_dim 64, window 128). Its 4096 case is
  skipped: eager holds several ``[64, 4096, 4097]`` fp32 score tensors at once (≈ 4.3 GB each), more than this
  shared machine can spare.

Time: both kernels are warmed up, then ``REPEATS`` rounds alternate them (ours, eager, ours, eager, …) so that
load from other processes hits both alike; the median is reported. Only ratios are meaningful on a busy box.

Peak memory: torch's CPU allocations are invisible to tracemalloc, so each (layout, layer, length, kernel) case
runs once in a fresh subprocess that builds its inputs, resets the kernel's peak-RSS counter (writing ``5`` to
``/proc/self/clear_refs``), runs forward + backward once, and reports ``VmHWM`` minus the resident size just
before the call: the most memory the OS ever had to give the attention call, including activations saved for
backward, gradients and any temporary. A fresh process per case means no allocator cache carries over between
kernels or lengths.

Summary (the last line): ``seq2048_speedup`` is eager time / ours for a sliding + full layer pair of the
``20b`` layout at 2048 (the model alternates the two); ``seq2048_mem_ratio`` is ours / eager peak memory for
the worse of the two layers. The goal is ≥ 2× and ≤ 0.5.

Run: ``python benchmarks/attention.py`` (10–20 minutes on 2 busy cores; eager at 20b × 2048 dominates).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
from rich.console import Console
from rich.table import Table
from transformers import GptOssConfig
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

from harmonyrl.models.attention import register_kernels
from harmonyrl.models.compat import cache_kwarg

REPEATS = 5
OURS, EAGER = "harmonyrl_sink_sdpa", "eager"


@dataclass(frozen=True)
class Layout:
    heads: int
    kv_heads: int
    head_dim: int
    window: int
    lengths: tuple[int, ...]


LAYOUTS = {
    "micro": Layout(4, 2, 32, 64, (512, 1024, 2048, 4096)),
    "20b": Layout(64, 8, 64, 128, (512, 1024, 2048)),
}
LAYERS = ("sliding", "full")


def make_case(layout: Layout, layer: str, t: int, kernel: str) -> Callable[[], None]:
    """Inputs for one attention call; returns a closure running forward + backward once."""
    register_kernels()
    g = torch.Generator().manual_seed(0)
    h, kvh, d = layout.heads, layout.kv_heads, layout.head_dim
    q = torch.randn(1, h, t, d, generator=g).requires_grad_()
    k = torch.randn(1, kvh, t, d, generator=g).requires_grad_()
    v = torch.randn(1, kvh, t, d, generator=g).requires_grad_()
    sinks = torch.randn(h, generator=g).requires_grad_()
    weights = torch.randn(1, t, h, d, generator=g)
    config = GptOssConfig(
        num_hidden_layers=2,
        num_attention_heads=h,
        num_key_value_heads=kvh,
        head_dim=d,
        hidden_size=h * d,
        sliding_window=layout.window,
        layer_types=["sliding_attention", "full_attention"],
    )
    config._attn_implementation = kernel
    build = create_sliding_window_causal_mask if layer == "sliding" else create_causal_mask
    mask = build(
        config=config,
        inputs_embeds=torch.zeros(1, t, 1),
        attention_mask=torch.ones(1, t, dtype=torch.long),
        **{cache_kwarg(build): None},
        position_ids=torch.arange(t)[None],
    )
    module = SimpleNamespace(num_key_value_groups=h // kvh, sinks=sinks, training=True)
    attend: Any = eager_attention_forward if kernel == EAGER else ALL_ATTENTION_FUNCTIONS[kernel]

    def run() -> None:
        for leaf in (q, k, v, sinks):
            leaf.grad = None
        out, _ = attend(module, q, k, v, mask, scaling=d**-0.5, dropout=0.0)
        (out * weights).sum().backward()

    return run


def peak_bytes(layout_name: str, layer: str, t: int, kernel: str) -> int:
    """Peak RSS growth of one forward + backward, in a fresh subprocess (see the module docstring)."""
    cmd = [sys.executable, __file__, "--peak", layout_name, layer, str(t), kernel]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return int(json.loads(done.stdout.strip().splitlines()[-1])["peak"])


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith(field + ":"))
    return int(line.split()[1])


def _child(layout_name: str, layer: str, t: int, kernel: str) -> None:
    run = make_case(LAYOUTS[layout_name], layer, t, kernel)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current resident size
    before = _status_kb("VmRSS")
    run()
    print(json.dumps({"peak": (_status_kb("VmHWM") - before) * 1024}))


def time_pair(layout: Layout, layer: str, t: int) -> dict[str, float]:
    """Median seconds of forward + backward per kernel, rounds interleaved."""
    runs = {kernel: make_case(layout, layer, t, kernel) for kernel in (OURS, EAGER)}
    for run in runs.values():
        run()
    times: dict[str, list[float]] = {kernel: [] for kernel in runs}
    for _ in range(REPEATS):
        for kernel, run in runs.items():
            start = time.perf_counter()
            run()
            times[kernel].append(time.perf_counter() - start)
    return {kernel: statistics.median(ts) for kernel, ts in times.items()}


def main() -> None:
    console = Console(width=120)  # a full-width table even when piped
    table = Table(title="GPT-OSS attention, forward + backward (fp32, batch 1)")
    for col in ("layout", "layer", "seq", "ours ms", "eager ms", "speedup", "ours MiB", "eager MiB", "mem ratio"):
        table.add_column(col, justify="right")
    results: dict[tuple[str, str, int], dict[str, float]] = {}
    for name, layout in LAYOUTS.items():
        for t in layout.lengths:
            for layer in LAYERS:
                secs = time_pair(layout, layer, t)
                mem = {kernel: peak_bytes(name, layer, t, kernel) for kernel in (OURS, EAGER)}
                results[name, layer, t] = {
                    "ours": secs[OURS],
                    "eager": secs[EAGER],
                    **{f"{k}_mem": v for k, v in mem.items()},
                }
                table.add_row(
                    name,
                    layer,
                    str(t),
                    f"{secs[OURS] * 1e3:.1f}",
                    f"{secs[EAGER] * 1e3:.1f}",
                    f"{secs[EAGER] / secs[OURS]:.2f}×",
                    f"{mem[OURS] / 2**20:.1f}",
                    f"{mem[EAGER] / 2**20:.1f}",
                    f"{mem[OURS] / mem[EAGER]:.3f}",
                )
                console.print(f"  done: {name} {layer} {t}", style="dim")
    console.print(table)
    pair = [results["20b", layer, 2048] for layer in LAYERS]
    speedup = sum(r["eager"] for r in pair) / sum(r["ours"] for r in pair)
    mem_ratio = max(r[f"{OURS}_mem"] / r[f"{EAGER}_mem"] for r in pair)
    micro = [results["micro", layer, 2048] for layer in LAYERS]
    micro_speedup = sum(r["eager"] for r in micro) / sum(r["ours"] for r in micro)
    micro_mem = max(r[f"{OURS}_mem"] / r[f"{EAGER}_mem"] for r in micro)
    console.print(f"micro layout at 2048: speedup {micro_speedup:.2f}×, memory ratio {micro_mem:.3f}")
    print(f"RESULT seq2048_speedup={speedup:.2f} seq2048_mem_ratio={mem_ratio:.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peak", nargs=4, metavar=("LAYOUT", "LAYER", "SEQ", "KERNEL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peak:
        _child(args.peak[0], args.peak[1], int(args.peak[2]), args.peak[3])
    else:
        main()
