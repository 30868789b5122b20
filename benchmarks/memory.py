"""Peak trainer memory and step time: full fine-tuning vs LoRA vs LoRA + activation checkpointing.

What is measured: the RL update exactly as a run makes it (``Learner.update``: GRPO, PPO-clip, one epoch, one
minibatch) on the default ``micro`` model built for ``rollout.max_seq_len=2048``, with one batch of ``EPISODES``
episodes of 2048 tokens each (a shared 256-token prompt, then 1792 sampled tokens; a group of two with one rewarded
episode, so nothing is dropped). Three variants, same model, seed and batch:

* ``full`` — every weight trains (AdamW state for all of them);
* ``lora`` — ``model.lora`` r=16 on q/k/v/o and the experts; only the adapters train;
* ``lora_ckpt`` — the same with ``model.gradient_checkpointing=true`` (which also runs an eager attention kernel in
  query chunks: ``harmonyrl.models.grad_checkpointing``).

Peak memory, two measures, each variant in a fresh subprocess (no allocator cache carries over):

* ``tensor MiB`` (the ``RESULT`` figure): the most memory torch's live tensors took above what existed before the
  update (activations saved for backward, gradients, optimizer state, temporaries), from the allocation and free
  events ``torch.profiler`` records with ``profile_memory=True``: the CPU counterpart of
  ``torch.cuda.max_memory_allocated`` (used on a GPU instead). It does not depend on the C allocator.
* ``RSS MiB``: ``VmHWM`` minus the resident size just before the update, after resetting the kernel's peak counter
  (writing ``5`` to ``/proc/self/clear_refs``): what the OS gave the process, including what glibc's malloc kept
  after torch freed it (docs/memory.md: with many mid-sized buffers that is most of it).

And ``weights MiB``: the live parameter and buffer bytes of the trainer's model and its reference policy (distinct
storages, before the update): with LoRA the reference is the model itself (adapters switched, 0 extra bytes), and
``--precision bf16`` keeps a LoRA run's frozen base in bf16 (docs/memory.md).

Step time: that update's wall clock (including the optimizer state's first allocation, and the profiler's
bookkeeping, the same for every variant); one step each on a shared machine: compare ratios only.

The last line: ``RESULT full_mib=… lora_mib=… lora_ckpt_mib=… lora_vs_full_step=…`` (LoRA's step time over the
full fine-tune's). The goal: ``lora_ckpt_mib`` ≤ ½ ``full_mib``.

Run: ``python benchmarks/memory.py [--precision bf16]`` (a few minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

VARIANTS = ("full", "lora", "lora_ckpt")
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
    from harmonyrl.trainer.learner import Learner
    from harmonyrl.trainer.setup import make_model
    from harmonyrl.types import Trajectory

    overrides = [f"rollout.max_seq_len={max(seq, SEQ)}", "device=cpu", f"model.attention={attention}",
                 f"model.precision={precision}"]  # fmt: skip
    if variant != "full":
        overrides += ["model.lora.r=16", "model.lora.targets=[q_proj,k_proj,v_proj,o_proj,experts]"]
    if variant == "lora_ckpt":
        overrides.append("model.gradient_checkpointing=true")
    config = load_config(None, overrides)
    tok = HarmonyTokenizer.load_default()
    model = make_model(config, tok)
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


def _child(variant: str, attention: str, precision: str) -> dict[str, float]:
    """One variant in this (fresh) process: weights MiB, peak MiB (tensors, RSS) and seconds of one update."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
    model, learner, trajs = build_update(variant, attention, precision=precision)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--attention", choices=("eager", "harmonyrl_sink_sdpa"), default="eager",
                        help="the trainer's attention kernel (model.attention)")  # fmt: skip
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                        help="model.precision (bf16: autocast; with LoRA the frozen base in bf16)")  # fmt: skip
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.child, args.attention, args.precision)))
        return
    rows, load_before = {}, os.getloadavg()[0]
    for variant in VARIANTS:
        cmd = [sys.executable, __file__, "--child", variant, "--attention", args.attention, "--precision",
               args.precision]  # fmt: skip
        # the profiler's USDT start/stop lines go to stderr; the child's last stdout line is its JSON
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
        rows[variant] = json.loads(out.stdout.strip().splitlines()[-1])
    head = f"micro model, one RL update of {EPISODES} episodes x {SEQ} tokens (prompt {PROMPT})"
    print(f"{head}, {args.precision}, {args.attention}")
    print(f"load average before: {load_before:.2f}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    print(f"{'variant':<10} {'trainable':>10} {'weights MiB':>11} {'tensor MiB':>10} {'RSS MiB':>8} {'step s':>7}")
    for variant, r in rows.items():
        mib = f"{r['weights_mib']:>11.2f} {r['peak_mib']:>10.0f} {r['rss_mib']:>8.0f}"
        print(f"{variant:<10} {int(r['trainable']):>10} {mib} {r['step_s']:>7.2f}")
    full, lora, ckpt = (rows[v] for v in VARIANTS)
    print(f"RSS full_mib={full['rss_mib']:.0f} lora_mib={lora['rss_mib']:.0f} lora_ckpt_mib={ckpt['rss_mib']:.0f}")
    print(
        f"RESULT full_mib={full['peak_mib']:.0f} lora_mib={lora['peak_mib']:.0f} lora_ckpt_mib={ckpt['peak_mib']:.0f} "
        f"lora_vs_full_step={lora['step_s'] / full['step_s']:.2f}"
    )


if __name__ == "__main__":
    main()
