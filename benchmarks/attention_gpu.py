"""The CUDA sink kernel (``harmonyrl_flex_sink``) vs transformers' eager GPT-OSS attention: forward + backward time
and peak memory at 2k, 8k and 32k tokens, and (``--check``) exactness of the output and every gradient.

What is measured: one attention call as ``GptOssAttention`` makes it with gpt-oss-20b's geometry (64 query heads,
8 KV heads, head dim 64, sliding window 128), batch 1, bf16, for a sliding-window and a full layer (the model
alternates them): ``q`` ``[1, 64, T, 64]``, ``k``/``v`` ``[1, 8, T, 64]``, the sinks, and the mask each kernel gets
from its own mask function (ours: a flex ``BlockMask`` built by the kernel's mask builder, compiled on CUDA;
eager: transformers' additive ``[1, 1, T, T]`` mask), then ``backward`` of a fixed random projection of the output.
Eager is ``transformers.models.gpt_oss.modeling_gpt_oss.eager_attention_forward``.

* Time: CUDA-synchronised wall time, median of ``--repeats`` rounds after one warm-up round (the warm-up of ours
  includes ``torch.compile``: flex is fused only when compiled; its first and second sequence lengths compile,
  later ones reuse the dynamic graph). ``mask_ms``: building our block mask once (a model builds one per layer
  type per forward).
* Peak memory: ``torch.cuda.max_memory_allocated`` during forward + backward minus what was allocated before
  (inputs included in neither), in MiB.
* Eager is skipped where its ``[64, T, T + 1]`` score tensors alone would exceed ``--eager-budget-gib`` (32k: one
  bf16 copy is 128 GiB), and reported ``oom`` if it runs out of memory anyway.

``--check`` then runs :func:`harmonyrl.models.attention_check.check_flex_sink` on the device, case by case
(fp32 within 1e-5, bf16 within bf16 rounding, forward and gradients of q, k, v and the sinks): after the timings,
so that a run stopped at its time limit keeps them. ``--json PATH`` writes every figure after each measurement.

Last line: ``RESULT seq8192_speedup=… seq8192_mem_ratio=… seq32768_flex_ms=… seq32768_flex_mib=… check=…``
(speedup: eager time / ours for the sliding + full pair; mem ratio: ours / eager peak, the worse layer). The
issue's goal at 8k: speedup ≥ 3, mem ratio ≤ 0.25.

Run on a GPU: ``python benchmarks/attention_gpu.py --check`` (a few minutes on one H200, most of it eager at 8k and
compiling). On a CPU: ``python benchmarks/attention_gpu.py --dry-run`` — tiny sizes, forward only (torch has no
flex backward on the CPU), seconds; it keeps this script from rotting in CI.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch
from transformers.masking_utils import causal_mask_function, sliding_window_causal_mask_function
from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

from harmonyrl.models.attention import flex_block_mask, flex_sink
from harmonyrl.models.attention_check import CASES, check_flex_sink, summary

HEADS, KV_HEADS, HEAD_DIM, WINDOW = 64, 8, 64, 128
LENGTHS = (2048, 8192, 32768)
LAYERS = ("sliding", "full")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_case(
    layer: str, t: int, kernel: str, device: torch.device, dtype: torch.dtype, heads: tuple[int, int, int, int]
) -> tuple[Callable[[bool], torch.Tensor], float]:
    """Inputs for one attention call; returns a closure running forward (+ backward) and the mask-building time."""
    h, kvh, d, window = heads
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, h, t, d, generator=g).to(device, dtype).requires_grad_()
    k = torch.randn(1, kvh, t, d, generator=g).to(device, dtype).requires_grad_()
    v = torch.randn(1, kvh, t, d, generator=g).to(device, dtype).requires_grad_()
    sinks = (torch.randn(h, generator=g) * 2).to(device, dtype).requires_grad_()
    weights = torch.randn(1, h, t, d, generator=g).to(device, dtype)
    fn = sliding_window_causal_mask_function(window) if layer == "sliding" else causal_mask_function
    start = time.perf_counter()
    if kernel == "flex":
        mask: Any = flex_block_mask(1, t, t, mask_function=fn, device=device)
    else:
        pos = torch.arange(t, device=device)
        keep = pos[None, :] <= pos[:, None]
        if layer == "sliding":
            keep &= pos[:, None] - pos[None, :] < window
        mask = torch.zeros(1, 1, t, t, dtype=dtype, device=device).masked_fill_(~keep, torch.finfo(dtype).min)
        del keep
    _sync(device)
    mask_s = time.perf_counter() - start
    module = SimpleNamespace(num_key_value_groups=h // kvh, sinks=sinks, training=True)

    def run(backward: bool) -> torch.Tensor:
        for leaf in (q, k, v, sinks):
            leaf.grad = None
        with torch.set_grad_enabled(backward):
            if kernel == "flex":
                out = flex_sink(q, k, v, sinks, mask, d**-0.5)
            else:
                out = eager_attention_forward(module, q, k, v, mask, scaling=d**-0.5)[0]  # type: ignore[arg-type]
            if backward:
                (out * weights.view(out.shape)).sum().backward()
        return out.detach()

    return run, mask_s


def measure(
    layer: str, t: int, kernel: str, device: torch.device, dtype: torch.dtype, repeats: int, backward: bool
) -> dict[str, Any]:
    """Median seconds and peak bytes of one forward (+ backward) (module docstring)."""
    heads = (HEADS, KV_HEADS, HEAD_DIM, WINDOW) if device.type == "cuda" else (4, 2, 16, 32)
    try:
        run, mask_s = make_case(layer, t, kernel, device, dtype, heads)
        run(backward)  # warm-up (compiles ours on CUDA)
        _sync(device)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            run(backward)
            _sync(device)
            times.append(time.perf_counter() - start)
        peak = 0
        if device.type == "cuda":
            before = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
            run(backward)
            _sync(device)
            peak = torch.cuda.max_memory_allocated(device) - before
        return {"ms": statistics.median(times) * 1e3, "mask_ms": mask_s * 1e3, "mib": peak / 2**20}
    except torch.cuda.OutOfMemoryError:
        return {"oom": True}
    except Exception as e:  # a kernel that fails to compile or run: recorded, the other measurements still run
        return {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()


def _fmt(r: dict[str, Any] | None) -> str:
    if r is None:
        return "skipped"
    if r.get("oom"):
        return "oom"
    if "error" in r:
        return f"error: {r['error']}"
    return f"{r['ms']:.2f} ms, {r['mib']:.0f} MiB (mask {r['mask_ms']:.1f} ms)"


def _graphs() -> int | None:
    try:
        from torch._dynamo.utils import counters

        return int(counters["stats"]["unique_graphs"])
    except Exception:  # a private counter: report nothing rather than fail the benchmark
        return None


def _write(path: str | None, figures: dict[str, Any]) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(figures, f, indent=2, default=str)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes, forward only (seconds)")
    parser.add_argument("--check", action="store_true", help="exactness (forward + gradients) vs eager first")
    parser.add_argument("--lengths", type=int, nargs="+", default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--eager-budget-gib", type=float, default=40.0)
    parser.add_argument("--json", default=None, help="write every figure to this file")
    args = parser.parse_args()

    cuda = torch.cuda.is_available() and not args.dry_run
    if not cuda and not args.dry_run:
        raise SystemExit("no GPU: run with --dry-run on the CPU (tiny sizes, forward only)")
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    lengths = tuple(args.lengths or (LENGTHS if cuda else (64, 200)))
    backward = cuda
    figures: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "torch": torch.__version__,
        "dtype": str(dtype),
        "backward": backward,
    }

    results: dict[str, dict[str, Any] | None] = {}
    figures["results"] = results  # written after every measurement: a run stopped at its time limit keeps them
    for t in lengths:
        for layer in LAYERS:
            for kernel in ("flex", "eager"):
                predicted_gib = HEADS * t * (t + 1) * dtype.itemsize / 2**30 if cuda else 0.0
                key = f"{kernel}_{layer}_{t}"
                if kernel == "eager" and predicted_gib > args.eager_budget_gib:
                    results[key] = None
                else:
                    results[key] = measure(layer, t, kernel, device, dtype, args.repeats, backward)
                print(f"{key}: {_fmt(results[key])}", flush=True)
                _write(args.json, figures)
    figures["compiled_graphs"] = _graphs()

    # exactness after the timings (a run stopped at its limit keeps those), case by case, each record kept
    check_ok: bool | None = None
    if args.check or args.dry_run:
        torch._dynamo.reset()  # the benchmark's compiled variants are not the check's
        records: list[dict[str, Any]] = []
        figures["check"] = records
        for case in CASES if cuda else CASES[:2]:
            try:
                records += check_flex_sink(device, backward=backward, cases=(case,))
            except Exception as e:  # recorded as a failed case; the other cases still run
                records.append({"case": case.name, "ok": False, "error": f"{type(e).__name__}: {str(e)[:300]}"})
            _write(args.json, figures)
        print(summary([r for r in records if "error" not in r]), *(r for r in records if "error" in r), flush=True)
        check_ok = all(r["ok"] for r in records)
        figures["check_max_err_fp32"] = max((r["err"] for r in records if r.get("dtype") == "float32"), default=None)
        _write(args.json, figures)

    def ok(r: dict[str, Any] | None) -> bool:
        return r is not None and "ms" in r

    parts = []
    mid = 8192 if 8192 in lengths else lengths[len(lengths) // 2]
    pair = [(results.get(f"flex_{layer}_{mid}"), results.get(f"eager_{layer}_{mid}")) for layer in LAYERS]
    if all(ok(f) and ok(e) for f, e in pair):
        speedup = sum(e["ms"] for _, e in pair) / sum(f["ms"] for f, _ in pair)  # type: ignore[index]
        parts.append(f"seq{mid}_speedup={speedup:.2f}")
        if cuda:
            ratio = max(f["mib"] / max(e["mib"], 1e-9) for f, e in pair)  # type: ignore[index]
            parts.append(f"seq{mid}_mem_ratio={ratio:.3f}")
    longest = max(lengths)
    flex_long = [results.get(f"flex_{layer}_{longest}") for layer in LAYERS]
    if all(ok(r) for r in flex_long):
        parts.append(f"seq{longest}_flex_ms={sum(r['ms'] for r in flex_long):.1f}")  # type: ignore[index]
        if cuda:
            parts.append(f"seq{longest}_flex_mib={max(r['mib'] for r in flex_long):.0f}")  # type: ignore[index]
    if check_ok is not None:
        parts.append(f"check={'ok' if check_ok else 'FAIL'}")
        if figures["check_max_err_fp32"] is not None:
            parts.append(f"check_max_err_fp32={figures['check_max_err_fp32']:.2e}")
    if args.dry_run:
        parts.append("dry_run=1")
    figures["result"] = "RESULT " + " ".join(parts)
    _write(args.json, figures)
    print(figures["result"])
    if check_ok is False:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
