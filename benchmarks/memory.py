"""Peak trainer memory and step time: arms that change one thing each — full fine-tuning, full + activation
checkpointing, LoRA, LoRA + checkpointing (and the attention kernel alone).

What is measured: the RL update exactly as a run makes it (``Learner.update``: GRPO, PPO-clip, one epoch, one
minibatch) on the default ``micro`` model built for ``rollout.max_seq_len=2048``, with one batch of ``EPISODES``
episodes of ``--seq`` tokens each (2048: a shared 256-token prompt, then 1792 sampled tokens; a group of two with
one rewarded episode, so nothing is dropped). Arms, same model, seed and batch:

* ``full`` — every weight trains (AdamW state for all of them);
* ``full_ckpt`` — ``full`` + ``model.gradient_checkpointing=true``;
* ``lora`` — ``full`` with ``model.lora`` r=16 on q/k/v/o and the experts: only the adapters train;
* ``lora_ckpt`` — ``lora`` + checkpointing;
* ``full_unchunked`` — ``full`` with the eager kernel forming whole ``[B, H, T, T + 1]`` score tensors.

Checkpointing also runs an eager kernel in query chunks (``harmonyrl.models.grad_checkpointing``); so that the
checkpointing arms change *only* checkpointing, every arm runs that chunked kernel, and ``full_unchunked`` is the
one arm that changes the kernel (a previous version compared LoRA + checkpointing + chunking with unchunked
full fine-tuning, two changes in one arm). ``--attention`` picks the kernel (default: the config's default,
``harmonyrl_eager``; ``harmonyrl_sink_sdpa`` has no chunked twin and never forms the score tensor).

Peak memory, two measures, each arm and repeat in a fresh subprocess (no allocator cache carries over):

* ``tensor MiB`` (the ``RESULT`` figure): the most memory torch's live tensors took above what existed before the
  update (activations saved for backward, gradients, optimizer state, temporaries), from the allocation and free
  events ``torch.profiler`` records with ``profile_memory=True``: the CPU counterpart of
  ``torch.cuda.max_memory_allocated`` (used on a GPU instead). It does not depend on the C allocator; the median
  over repeats is reported, and a line names any arm whose repeats differed.
* ``RSS MiB``: ``VmHWM`` minus the resident size just before the update, after resetting the kernel's peak counter
  (writing ``5`` to ``/proc/self/clear_refs``): what the OS gave the process, including what glibc's malloc kept
  after torch freed it (docs/memory.md: with many mid-sized buffers that is most of it).

And ``weights MiB``: the live parameter and buffer bytes of the trainer's model and its reference policy (distinct
storages, before the update): with LoRA the reference is the model itself (adapters switched, 0 extra bytes), and
``--precision bf16`` keeps a LoRA run's frozen base in bf16 (docs/memory.md).

Step time: that update's wall clock (including the optimizer state's first allocation and the profiler's
bookkeeping, the same for every arm), ``--repeats`` times per arm, the arms interleaved and their order reversed
every other round (A B … B A); reported as median and range (:func:`harmonyrl.telemetry.stats.spread`).

The last line: ``RESULT full_mib=… full_ckpt_mib=… lora_mib=… lora_ckpt_mib=… full_unchunked_mib=…
ckpt_vs_full=… lora_ckpt_vs_full=… lora_vs_full_step=… ckpt_vs_full_step=… repeats=…`` (memory ratios of tensor
peaks; step ratios of medians). ``--quick``: 512-token episodes, one repeat (a smoke test, about a minute).

Run: ``python benchmarks/memory.py [--precision bf16] [--repeats 3]`` (a few minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from harmonyrl.telemetry.stats import spread

VARIANTS = ("full", "full_ckpt", "lora", "lora_ckpt", "full_unchunked")
EPISODES = 2
SEQ = 2048
PROMPT = 256


def _kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _tensor_peak_mib(result: object) -> float:
    """Peak of live CPU tensor bytes above the start, from a profiler result's allocation (+) and free (-) events."""
    from torch._C._profiler import _EventType

    events, stack = [], list(result.experimental_event_tree())  # type: ignore[attr-defined]
    while stack:
        e = stack.pop()
        if e.tag == _EventType.Allocation and e.extra_fields.device.type == "cpu":
            events.append((e.start_time_ns, -e.extra_fields.alloc_size))  # same instant: allocations first
        stack.extend(e.children)
    live = peak = 0
    for _, minus_bytes in sorted(events):
        live -= minus_bytes
        peak = max(peak, live)
    return peak / 2**20


def build_update(variant: str, attention: str, seq: int = SEQ, precision: str = "fp32") -> tuple[Any, Any, list[Any]]:
    """The model, learner and batch of one variant's update: ``EPISODES`` episodes of ``seq`` tokens (a shared
    ``PROMPT``-token prompt, then sampled tokens; groups of two with one rewarded episode, so nothing is dropped).
    Also the batch of ``benchmarks/memory_breakdown.py``."""
    import torch

    from harmonyrl.config import load_config
    from harmonyrl.harmony.tokenizer import HarmonyTokenizer
    from harmonyrl.models.attention import chunk_eager_queries
    from harmonyrl.rl.learner import Learner
    from harmonyrl.run.setup import make_model
    from harmonyrl.types import Trajectory

    overrides = [f"rollout.max_seq_len={max(seq, SEQ)}", "device=cpu", f"model.attention={attention}",
                 f"model.precision={precision}"]  # fmt: skip
    if variant.startswith("lora"):
        overrides += ["model.lora.r=16", "model.lora.targets=[q_proj,k_proj,v_proj,o_proj,experts]"]
    if variant.endswith("_ckpt"):
        overrides.append("model.gradient_checkpointing=true")
    config = load_config(None, overrides)
    tok = HarmonyTokenizer.load_default()
    model = make_model(config, tok)
    if variant != "full_unchunked":  # the kernel checkpointing runs, in every other arm too (one change per arm)
        chunk_eager_queries(model)
    learner = Learner.create(config.rl, model, tok.special.endoftext, float(seq), config.seed,
                             precision=config.model.precision)  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    prompt = tuple(torch.randint(0, tok.vocab_size, (PROMPT,), generator=gen).tolist())
    trajs = []
    for i in range(EPISODES):
        tail = tuple(torch.randint(0, tok.vocab_size, (seq - PROMPT,), generator=gen).tolist())
        mask = (0,) * PROMPT + (1,) * (seq - PROMPT)
        reward = float(i % 2)
        trajs.append(
            Trajectory(f"t{i // 2}", i // 2, prompt + tail, mask, (-7.0,) * seq, reward, True, False, None, ())
        )
    return model, learner, trajs


def weight_mib(learner: Any) -> float:
    """MiB of the distinct storages under the trainer's model and its reference policy (parameters and buffers)."""
    ref = learner.reference.module
    tensors = [*learner.model.parameters(), *learner.model.buffers(), *ref.parameters(), *ref.buffers()]
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values()) / 2**20


def _child(variant: str, attention: str, precision: str, seq: int) -> dict[str, float]:
    """One variant in this (fresh) process: weights MiB, peak MiB (tensors, RSS) and seconds of one update."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
    model, learner, trajs = build_update(variant, attention, seq, precision=precision)
    weights = weight_mib(learner)
    cuda = torch.cuda.is_available() and next(model.parameters()).is_cuda
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    base = _kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        assert learner.update(trajs).applied
    seconds = time.perf_counter() - t0
    rss_mib = (_kib("VmHWM") - base) / 1024
    peak_mib = torch.cuda.max_memory_allocated() / 2**20 if cuda else _tensor_peak_mib(prof.profiler.kineto_results)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {"peak_mib": peak_mib, "rss_mib": rss_mib, "step_s": seconds, "trainable": float(trainable),
            "weights_mib": weights}  # fmt: skip


def run_arms(args: argparse.Namespace) -> dict[str, list[dict[str, float]]]:
    """Every arm ``--repeats`` times, each in a fresh subprocess, in A B … then … B A order by round."""
    rows: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    for round_ in range(args.repeats):
        for variant in VARIANTS if round_ % 2 == 0 else VARIANTS[::-1]:
            cmd = [sys.executable, __file__, "--child", variant, "--attention", args.attention, "--precision",
                   args.precision, "--seq", str(args.seq)]  # fmt: skip
            # the profiler's USDT start/stop lines go to stderr; the child's last stdout line is its JSON
            out = subprocess.run(cmd, capture_output=True, text=True, check=True)
            rows[variant].append(json.loads(out.stdout.strip().splitlines()[-1]))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--attention", choices=("eager", "harmonyrl_eager", "harmonyrl_sink_sdpa"),
                        default="harmonyrl_eager", help="the trainer's attention kernel (model.attention)")  # fmt: skip
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                        help="model.precision (bf16: autocast; with LoRA the frozen base in bf16)")  # fmt: skip
    parser.add_argument("--seq", type=int, default=SEQ, help="tokens per episode")
    parser.add_argument("--repeats", type=int, default=3, help="fresh-process repeats of every arm")
    parser.add_argument("--quick", action="store_true", help="512-token episodes, one repeat: a smoke test")
    args = parser.parse_args()
    if args.quick:
        args.seq, args.repeats = 2 * PROMPT, 1
    if args.child:
        print(json.dumps(_child(args.child, args.attention, args.precision, args.seq)))
        return
    load_before = os.getloadavg()[0]
    rows = run_arms(args)
    head = f"micro model, one RL update of {EPISODES} episodes x {args.seq} tokens (prompt {PROMPT})"
    print(f"{head}, {args.precision}, {args.attention}, {args.repeats} repeat(s) per arm, interleaved")
    print(f"load average before: {load_before:.2f}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    print(
        f"{'arm':<15} {'trainable':>10} {'weights MiB':>11} {'tensor MiB':>10} {'RSS MiB':>8}  step s: median [range]"
    )
    peak, step = {}, {}
    for variant, runs in rows.items():
        r = runs[0]
        peak[variant] = spread([x["peak_mib"] for x in runs])
        step[variant] = spread([x["step_s"] for x in runs])
        rss = statistics.median(x["rss_mib"] for x in runs)
        mib = f"{r['weights_mib']:>11.2f} {peak[variant].median:>10.0f} {rss:>8.0f}"
        print(f"{variant:<15} {int(r['trainable']):>10} {mib}  {step[variant]}")
    for variant, p in peak.items():
        if p.low != p.high:
            print(f"note: {variant}'s tensor peak differed between repeats: {p}")
    rss_line = " ".join(f"{v}_mib={statistics.median(x['rss_mib'] for x in rows[v]):.0f}" for v in VARIANTS)
    print(f"RSS {rss_line}")
    mibs = " ".join(f"{v}_mib={peak[v].median:.0f}" for v in VARIANTS)
    print(
        f"RESULT {mibs} ckpt_vs_full={peak['full_ckpt'].median / peak['full'].median:.2f} "
        f"lora_ckpt_vs_full={peak['lora_ckpt'].median / peak['full'].median:.2f} "
        f"lora_vs_full_step={step['lora'].median / step['full'].median:.2f} "
        f"ckpt_vs_full_step={step['full_ckpt'].median / step['full'].median:.2f} repeats={args.repeats}"
    )


if __name__ == "__main__":
    main()
