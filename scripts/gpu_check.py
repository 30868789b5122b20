"""The GPU check: one prepared run of everything that needs CUDA, within ~8 minutes on one H200.

Sections, each in a subprocess of its own (a CUDA error in one cannot poison the next), in this order, each
given a share of what is left of ``--budget-s`` (``SHARE``); a section stopped at its limit (its process group
killed) still reports the figures it had kept:

* ``train`` (a): the tiny ``harmonyrl train device=cuda`` end to end, once per advantage estimator (grpo,
  rloo, reinforce_pp, gae, a2c) and once with the GSPO loss and R3 routing replay: every RL step must update
  (equal-reward groups are not skipped here), seconds, held-out success before/after (a nano model: this proves
  the path runs on the device, not that it learns).
* ``gate``: the mismatch gate (``harmonyrl check-mismatch``, :mod:`harmonyrl.jobs.check_mismatch`) on the
  device: the tiny run's RL steps with the embedded engine, fp32 (engine and trainer) and bf16 (engine dtype and
  trainer autocast), each judged at its precision's documented bound; the mean KL, worst step and verdict of each.
* ``kernel`` (c): ``benchmarks/attention_gpu.py --check``: the flex sink kernel's exactness (forward and every
  gradient) and its time and peak memory against eager at 2k, 8k and 32k tokens.
* ``checkpoint`` (b): a synthetic checkpoint with gpt-oss-20b's exact geometry (random weights, MXFP4 experts,
  :mod:`harmonyrl.models.synthetic`) written to ``/dev/shm`` and checked by ``harmonyrl check-checkpoint``: seconds
  for each.
* ``lora_step`` (b, e): that checkpoint loaded in bf16 onto the GPU (seconds, GiB on the GPU), then LoRA (r=16
  on the attention projections), activation checkpointing and the flex sink kernel, two policy updates per length
  (``--lora-tokens``, 4k by default; forward, PPO-clip loss on the sampled tokens as the trainer scores them,
  backward, AdamW on the adapters): peak GPU memory, step time,
  tokens/s and MFU (6 × active parameters per token, against the H200's 989 TFLOP/s dense bf16), beside the
  analytic memory model's prediction (:mod:`harmonyrl.learn.footprint`) and its error. This is the update's
  model path, not the trainer's loop.
* ``engine`` (d): the embedded engine (bf16, on the GPU) vs transformers ``generate`` on a two-layer model with
  the 20b's layer geometry: tokens/s of each, and the engine-vs-trainer mismatch on the engine's own samples
  (mean k1 and k3 KL estimates, largest per-token log-prob gap; trainer forward in bf16 and in fp32), and one
  profiled call of each (wall time, kernel launches, the ops with the most host and device time).

Writes ``gpu_check.json`` (every figure, each section's status, versions, the machine) and ``gpu_check.log`` into
``--out``; the last line is ``RESULT sections_ok=K/N …``. ``--dry-run`` runs every section on the CPU at tiny
sizes (seconds each; the kernel forward only) so that this script cannot rot: ``.ci/run`` runs it.

Run on the GPU machine through ``scripts/gpu_check.sh`` (it installs the carried wheels first).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # engine_precision: the engine section's measure and rounding
ORDER = ("train", "gate", "kernel", "checkpoint", "lora_step", "engine")
SHARE = {"train": 0.2, "gate": 0.12, "kernel": 0.45, "checkpoint": 0.45, "lora_step": 0.6, "engine": 1.0}
"""Most of the time left that a section may take (the rest is kept for the sections after it)."""
ESTIMATORS = ("grpo", "rloo", "reinforce_pp", "gae", "a2c")
H200_BF16_TFLOPS = 989.0
RL_STEPS = 2
TINY = [
    "model.preset=nano", "sft.steps=3", "sft.batch_size=4", f"rl.steps={RL_STEPS}", "rollout.tasks_per_step=2",
    "rollout.group_size=2", "rollout.max_new_tokens=32", "eval.n_tasks=4", "env.n_train=64", "env.n_test=8",
    "rl.skip_zero_variance_groups=false",  # a nano model's rewards are all 0: every step must still update
]  # fmt: skip
SMALL_GEOMETRY = {
    "hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 2, "num_local_experts": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256,
}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes: checks that every section still runs")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "runs/gpu_check"))
    parser.add_argument("--only", default=",".join(ORDER), help=f"comma-separated sections of {','.join(ORDER)}")
    parser.add_argument("--budget-s", type=float, default=540.0, help="wall-clock budget of all sections together")
    parser.add_argument("--lora-tokens", default="4096", help="lora_step: comma-separated update lengths, in tokens")
    parser.add_argument("--lora-scoring", choices=("trainer", "whole"), default="trainer",
                        help="lora_step: log-probs as the trainer scores them (chunked over the vocabulary), or "
                        "log_softmax of the whole logits (the first GPU run's path)")  # fmt: skip
    parser.add_argument("--section", default=None, help=argparse.SUPPRESS)  # the child process's own section
    args = parser.parse_args()
    if not all(t.strip().isdigit() and int(t) > 1 for t in args.lora_tokens.split(",")):
        sys.exit(f"gpu_check: --lora-tokens wants comma-separated token counts above 1, got {args.lora_tokens!r}")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.section is not None:
        path = args.out / f"{args.section}.json"

        def keep(figures: dict[str, Any]) -> None:  # what a section has so far: kept if it is stopped at its limit
            path.write_text(json.dumps({**figures, "status": "partial"}, indent=1, default=str))

        extra: dict[str, Any] = {}
        if args.section == "lora_step":
            extra = {"tokens": tuple(int(t) for t in args.lora_tokens.split(",")), "scoring": args.lora_scoring}
        figures = SECTIONS[args.section](args.dry_run, args.out, keep, **extra)
        path.write_text(json.dumps(figures, indent=1, default=str))
        return
    run_all(args)


def run_all(args: argparse.Namespace) -> None:
    chosen = [s for s in ORDER if s in args.only.split(",")]
    unknown = set(args.only.split(",")) - set(ORDER)
    if unknown:
        sys.exit(f"gpu_check: unknown section(s) {sorted(unknown)}; choose from {', '.join(ORDER)}")
    log = (args.out / "gpu_check.log").open("w")
    report: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "dry_run": args.dry_run,
                              "machine": machine(), "sections": {}}  # fmt: skip
    end = time.monotonic() + args.budget_s
    for name in chosen:
        left = end - time.monotonic()
        if left < 20:
            report["sections"][name] = {"status": "not_run", "why": "the budget was spent"}
            continue
        limit = left if name == chosen[-1] else max(20.0, left * SHARE[name])
        report["sections"][name] = run_section(name, args, limit, log)
        print(f"gpu_check: {name}: {report['sections'][name]['status']}", flush=True)
        (args.out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))  # after each section
    (args.out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))
    ok = sum(s["status"] == "ok" for s in report["sections"].values())
    print(f"RESULT sections_ok={ok}/{len(chosen)} " + " ".join(headline(report["sections"])), flush=True)
    sys.exit(0 if ok == len(chosen) else 1)


def run_section(name: str, args: argparse.Namespace, limit: float, log: Any) -> dict[str, Any]:
    """Run one section in a child process within ``limit`` seconds; its figures, or why there are none.

    The child leads a process group of its own: at the limit the whole group is killed (a benchmark it started
    too, which would otherwise hold the GPU through the next sections), and what it had kept is reported.
    """
    argv = [sys.executable, __file__, "--section", name, "--out", str(args.out), "--lora-tokens", args.lora_tokens,
            "--lora-scoring", args.lora_scoring]  # fmt: skip
    argv += ["--dry-run"] * args.dry_run
    out = args.out / f"{name}.json"
    out.unlink(missing_ok=True)
    start = time.monotonic()
    log.write(f"\n===== {name} (limit {limit:.0f} s) =====\n")
    log.flush()
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
    try:
        proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        kept = read_json(out)  # {} if it was never written, or killed mid-write
        return {**kept, "status": "timeout", "seconds": round(limit, 1)}
    took = round(time.monotonic() - start, 1)
    if proc.returncode != 0 or not out.is_file():
        kept = read_json(out)  # {} if it was never written, or killed mid-write
        why = tail(args.out / "gpu_check.log")
        return {**kept, "status": "failed", "exit": proc.returncode, "seconds": took, "why": why}
    figures = json.loads(out.read_text())
    return {"status": figures.pop("status", "ok"), "seconds": took, **figures}


def tail(path: Path, lines: int = 6) -> str:
    return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])


def headline(sections: dict[str, dict[str, Any]]) -> list[str]:
    """The figures the RESULT line carries, where their section ran."""
    keys = {
        "kernel": ("seq8192_speedup", "seq8192_mem_ratio", "check"),
        "lora_step": ("load_s", "gpu_gib", "peak_gib", "prediction_error", "mfu"),
        "checkpoint": ("write_s", "check_checkpoint_exit"),
        "engine": ("engine_vs_hf", "k3_bf16"),
        "train": ("runs_ok",),
        "gate": ("gate_fp32_kl", "gate_bf16_kl", "gates_passed"),
    }
    return [f"{k}={sections[s][k]}" for s, ks in keys.items() if s in sections for k in ks if k in sections[s]]


def machine() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__}
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        info["transformers"] = None
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpu_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    return info


# ---- sections (each runs in its own process) ---------------------------------------------------------------

Keep = Callable[[dict[str, Any]], None]
"""A section's figures so far, written to its JSON: what a section stopped at its time limit still reports."""


def device_of(dry_run: bool) -> str:
    import torch

    if dry_run:
        return "cpu"
    if not torch.cuda.is_available():
        raise SystemExit("gpu_check: torch sees no GPU (use --dry-run on a CPU)")
    return "cuda"


def section_train(dry_run: bool, out: Path, keep: Keep) -> dict[str, Any]:
    """(a) The tiny ``harmonyrl train`` on the device, every estimator, in this process (one import for all)."""
    from harmonyrl.cli import app

    device = device_of(dry_run)
    variants = {k: [f"rl.advantage.kind={k}"] for k in ESTIMATORS}
    variants["gspo_r3"] = ["rl.loss.kind=gspo", "rl.routing_replay=r3"]
    runs: dict[str, Any] = {}
    for name, extra in variants.items():
        start = time.monotonic()
        argv = ["train", f"device={device}", *TINY, *extra, f"output_dir={out / 'runs'}", f"run_name={name}"]
        try:
            app([*argv, "--overwrite"], standalone_mode=False)
            folder = out / "runs" / name
            rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
            updates = sum(r.get("phase") == "rl" and r.get("train/skipped") == 0.0 for r in rows)
            summary = json.loads((folder / "summary.json").read_text())
            took = round(time.monotonic() - start, 1)
            runs[name] = {"ok": updates == RL_STEPS, "updates": updates, "seconds": took, "summary": summary}
        except BaseException as e:  # SystemExit from a one-line error too: record it, go on with the next
            runs[name] = {"ok": False, "error": f"{type(e).__name__}: {str(e)[:300]}"}
        keep({"runs": runs})
    ok = sum(r["ok"] for r in runs.values())
    return {"status": "ok" if ok == len(runs) else "failed", "runs_ok": f"{ok}/{len(runs)}", "runs": runs}


GATE_STEPS = 3
GATE_PRECISIONS = {"fp32": [], "bf16": ["model.precision=bf16", "rollout.engine.dtype=bfloat16"]}


def section_gate(dry_run: bool, out: Path, keep: Keep) -> dict[str, Any]:
    """The mismatch gate on the device, at each precision (the function ``harmonyrl check-mismatch`` runs)."""
    import asyncio

    from engine_precision import sig
    from rich.console import Console

    from harmonyrl.config import load_config
    from harmonyrl.jobs.check_mismatch import GATE_DEFAULTS, run_gate

    device = device_of(dry_run)
    figures: dict[str, Any] = {}
    for name, extra in GATE_PRECISIONS.items():
        overrides = [*GATE_DEFAULTS, f"device={device}", *TINY, "rollout.group_size=4", f"rl.steps={GATE_STEPS}",
                     *extra, f"output_dir={out / 'gate'}", f"run_name={name}"]  # fmt: skip
        try:
            result = asyncio.run(run_gate(load_config(None, overrides), None, Console(quiet=True)))
            figures[f"gate_{name}_kl"] = sig(result.mean)
            figures[name] = {"passed": result.passed, "bound": result.bound, "worst": result.worst,
                             "line": result.line()}  # fmt: skip
            print(result.line(), flush=True)
        except BaseException as e:  # a one-line error too: recorded, the other precision still runs
            figures[name] = {"passed": False, "error": f"{type(e).__name__}: {str(e)[:300]}"}
        keep(figures)
    passed = sum(f["passed"] for k, f in figures.items() if k in GATE_PRECISIONS)
    figures["gates_passed"] = f"{passed}/{len(GATE_PRECISIONS)}"
    return {"status": "ok" if passed == len(GATE_PRECISIONS) else "failed", **figures}


def section_kernel(dry_run: bool, out: Path, keep: Keep) -> dict[str, Any]:
    """(c) The sink kernel's exactness, time and memory (``benchmarks/attention_gpu.py``)."""
    path = out / "kernel_bench.json"  # rewritten after every measurement: kept if this section is stopped
    flags = ["--dry-run"] if dry_run else ["--check"]
    script = str(ROOT / "benchmarks" / "attention_gpu.py")
    proc = subprocess.Popen([sys.executable, script, *flags, "--json", str(path)])  # its output goes to the log
    while proc.poll() is None:
        time.sleep(2)
        keep({"details": read_json(path)})
    details = read_json(path)
    result = details.get("result", "")
    figures: dict[str, Any] = dict(kv.split("=", 1) for kv in result.split()[1:])
    return {"status": "ok" if proc.returncode == 0 and result else "failed", **figures, "details": details}


def read_json(path: Path) -> dict[str, Any]:
    """A JSON file another process may be rewriting: ``{}`` where it is missing or half written."""
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}


def synthetic_folder(dry_run: bool, out: Path) -> Path:
    """Where the 20b-geometry checkpoint is written: RAM (``/dev/shm``) when it has room, so disk speed is not timed."""
    shm = Path("/dev/shm")
    if not dry_run and shm.is_dir() and os.statvfs(shm).f_bavail * os.statvfs(shm).f_frsize > 20 << 30:
        return shm / "harmonyrl-gpu-check-20b"
    return out / ("synthetic-small" if dry_run else "synthetic-20b")


def geometry(dry_run: bool) -> dict[str, Any]:
    from harmonyrl.models.synthetic import GPT_OSS_20B, scaled

    return scaled(GPT_OSS_20B, **SMALL_GEOMETRY) if dry_run else GPT_OSS_20B


def section_checkpoint(dry_run: bool, out: Path, keep: Keep) -> dict[str, Any]:
    """(b) Write a checkpoint with gpt-oss-20b's geometry and check it with ``harmonyrl check-checkpoint``; the
    load onto the GPU is timed in ``lora_step`` (one load of 13 GB per check, not two)."""
    from harmonyrl.models.synthetic import write_synthetic

    folder = synthetic_folder(dry_run, out)
    start = time.monotonic()
    if not (folder / "model.safetensors.index.json").is_file():
        write_synthetic(folder, geometry(dry_run), shard_bytes=(1 << 20) if dry_run else (4 << 30))
    wrote = time.monotonic() - start
    figures: dict[str, Any] = {"folder": str(folder), "write_s": round(wrote, 1)}
    keep(figures)
    start = time.monotonic()
    cli = [sys.executable, "-m", "harmonyrl.cli", "check-checkpoint", str(folder)]
    checked = subprocess.run(cli, capture_output=True, text=True)
    print(checked.stdout[-2000:], checked.stderr[-2000:], flush=True)
    check_s = time.monotonic() - start
    figures.update(check_checkpoint_s=round(check_s, 1), check_checkpoint_exit=checked.returncode)
    return {"status": "ok" if checked.returncode == 0 else "failed", **figures}


def section_lora_step(
    dry_run: bool, out: Path, keep: Keep, tokens: tuple[int, ...] = (4096,), scoring: str = "trainer"
) -> dict[str, Any]:
    """(e) LoRA policy updates of the 20b geometry (4k tokens by default): bf16 base, checkpointing, the sink
    kernel; the log-probs scored as the trainer scores them (``trainer``) or in one piece (``whole``)."""
    import torch

    from harmonyrl.learn.footprint import Plan, estimate
    from harmonyrl.learn.token_scores import LOGITS_BUDGET
    from harmonyrl.models import grad_checkpointing
    from harmonyrl.models.attention import set_kernel
    from harmonyrl.models.load import load_checkpoint
    from harmonyrl.models.lora import add_lora
    from harmonyrl.models.synthetic import write_synthetic
    from harmonyrl.plan.estimate import active_parameters

    device = torch.device(device_of(dry_run))
    tokens = (256,) if dry_run else tokens
    folder = synthetic_folder(dry_run, out)
    if not (folder / "model.safetensors.index.json").is_file():
        write_synthetic(folder, geometry(dry_run), shard_bytes=(1 << 20) if dry_run else (4 << 30))
    start = time.monotonic()
    model = load_checkpoint(folder, dtype=torch.bfloat16, device=device)
    sync(device)
    gib = torch.cuda.memory_allocated() / 2**30 if device.type == "cuda" else None
    loaded = {"load_s": round(time.monotonic() - start, 1), "gpu_gib": None if gib is None else round(gib, 1),
              "parameters_b": round(sum(p.numel() for p in model.parameters()) / 1e9, 2)}  # fmt: skip
    keep(loaded)
    add_lora(model, r=16, alpha=32, dropout=0.0, targets=("q_proj", "k_proj", "v_proj", "o_proj"))
    for p in model.parameters():
        if p.requires_grad:
            p.data = p.data.float()  # fp32 master weights for what trains only
    grad_checkpointing.enable(model)
    if device.type == "cuda":
        set_kernel(model, "harmonyrl_flex_sink")
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    budget = {"trainer": LOGITS_BUDGET, "whole": None}[scoring]  # how the update below scores its log-probs
    by_tokens: dict[int, dict[str, Any]] = {}
    for t in tokens:
        predicted = estimate(model.config, Plan(tokens=t, reference="none", engine="none", logits_budget=budget))
        try:
            by_tokens[t] = lora_update(model, optimizer, t, device, predicted.total / 2**30, scoring)
        except torch.cuda.OutOfMemoryError as e:
            by_tokens[t] = {"oom": str(e)[:200]}
        keep({**loaded, "by_tokens": by_tokens})
    first = by_tokens[tokens[0]]
    ok = all("oom" not in r for r in by_tokens.values())
    return {"status": "ok" if ok else "failed", **loaded, "scoring": scoring,
            "active_parameters_b": round(active_parameters(model.config) / 1e9, 2), **first,
            "by_tokens": by_tokens}  # fmt: skip


def lora_update(
    model: Any, optimizer: Any, tokens: int, device: Any, predicted_gib: float, scoring: str
) -> dict[str, Any]:
    """Two policy updates of ``tokens`` tokens (the first compiles the kernel for this length; the second is
    timed): step seconds, tokens/s, MFU, and the peak GPU memory over both against the memory model's prediction."""
    import torch

    from harmonyrl.algorithms.losses import ppo_clip_loss
    from harmonyrl.learn.batch import score
    from harmonyrl.plan.estimate import active_parameters

    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size - 2, (1, tokens), generator=gen).to(device)
    mask = torch.zeros(1, tokens - 1, device=device)
    mask[:, tokens // 4 :] = 1.0  # the prompt's quarter is not trained on
    advantages = torch.randn(1, tokens - 1, generator=gen).to(device)
    times = []
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    for _ in range(2):
        start = time.monotonic()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            if scoring == "trainer":
                logp = score(model, ids, torch.ones_like(ids), share_prefix=False).logprobs
            else:
                logits = model(input_ids=ids).logits[:, :-1].float()
                logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
                del logits
        loss = ppo_clip_loss(logp, logp.detach(), advantages, mask, 0.2, 0.28).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        sync(device)
        times.append(time.monotonic() - start)
        del logp, loss
    step_s = times[-1]
    flops = 6 * active_parameters(model.config) * tokens
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None
    return {"tokens": tokens, "step_s": round(step_s, 3), "first_step_s": round(times[0], 1),
            "tokens_per_s": round(tokens / step_s, 1), "peak_gib": None if peak is None else round(peak, 1),
            "mfu": round(flops / step_s / (H200_BF16_TFLOPS * 1e12), 4) if device.type == "cuda" else None,
            "predicted_peak_gib": round(predicted_gib, 1),
            "prediction_error": None if peak is None else round(predicted_gib / peak - 1, 3)}  # fmt: skip


def section_engine(dry_run: bool, out: Path, keep: Keep) -> dict[str, Any]:
    """(d) Engine vs ``generate`` tokens/s, and engine-vs-trainer mismatch on the engine's own samples."""
    import asyncio

    import torch
    from engine_precision import mismatch
    from transformers import GptOssConfig, GptOssForCausalLM

    from harmonyrl.engine.local.engine import LocalEngine
    from harmonyrl.models.synthetic import GPT_OSS_20B, scaled
    from harmonyrl.types import SamplingParams

    device = torch.device(device_of(dry_run))
    changes = SMALL_GEOMETRY if dry_run else {"num_hidden_layers": 2}
    config = GptOssConfig(**scaled(GPT_OSS_20B, **changes))
    del config.quantization_config
    torch.manual_seed(0)
    model = GptOssForCausalLM(config)
    torch.nn.Module.to(model, device=device, dtype=torch.bfloat16)  # in place; transformers wraps .to
    model.eval()
    prompts, new = (4, 8) if dry_run else (32, 128)
    gen = torch.Generator().manual_seed(0)
    batch = [torch.randint(0, config.vocab_size - 2, (64,), generator=gen).tolist() for _ in range(prompts)]
    engine = LocalEngine(model, max_batch=64, max_seq_len=512, dtype=torch.bfloat16, kernel="torch", device=device)
    params = [SamplingParams(temperature=1.0, max_new_tokens=new, seed=i) for i in range(prompts)]

    async def sample() -> list[Any]:
        return list(await asyncio.gather(*(engine.generate(p, s) for p, s in zip(batch, params, strict=True))))

    def timed(fn: Any) -> tuple[Any, float]:
        fn()  # warm-up
        sync(device)
        start = time.monotonic()
        result = fn()
        sync(device)
        return result, time.monotonic() - start

    gens, engine_s = timed(lambda: asyncio.run(sample()))
    ids = torch.tensor(batch, device=device)
    _, hf_s = timed(lambda: model.generate(input_ids=ids, do_sample=True, max_new_tokens=new, min_new_tokens=new,
                                           top_k=0, pad_token_id=config.pad_token_id))  # fmt: skip
    engine_tokens = sum(len(g.token_ids) for g in gens)
    figures: dict[str, Any] = {"status": "ok", "engine_tokens_per_s": round(engine_tokens / engine_s, 1),
                               "hf_tokens_per_s": round(prompts * new / hf_s, 1)}  # fmt: skip
    figures["engine_vs_hf"] = round(figures["engine_tokens_per_s"] / figures["hf_tokens_per_s"], 2)
    keep(figures)
    figures["profile"] = {  # where each one's time goes (the engine was 0.66x generate on the H200: why)
        "engine": profiled(lambda: asyncio.run(sample()), device, out / "engine_profile.txt"),
        "hf": profiled(lambda: model.generate(input_ids=ids, do_sample=True, max_new_tokens=new, min_new_tokens=new,
                                              top_k=0, pad_token_id=config.pad_token_id),
                       device, out / "hf_profile.txt"),
    }  # fmt: skip
    keep(figures)
    for dtype in (torch.bfloat16, torch.float32):
        torch.nn.Module.to(model, dtype=dtype)
        k1, k3, gap = mismatch(model, batch, gens, device)
        name = "bf16" if dtype == torch.bfloat16 else "fp32"
        figures.update({f"k1_{name}": k1, f"k3_{name}": k3, f"max_gap_{name}": gap})
        keep(figures)
    asyncio.run(engine.close())
    return figures


def profiled(fn: Any, device: Any, table: Path, top: int = 12) -> dict[str, Any]:
    """One call of ``fn`` under torch's profiler: wall seconds, kernel launches, and the ops with the most self
    time on the host and (CUDA) on the device; the full table is written to ``table``."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * cuda
    start = time.monotonic()
    with profile(activities=activities) as prof:
        fn()
        sync(device)
    wall = time.monotonic() - start
    events = prof.key_averages()
    sort = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    table.write_text(events.table(sort_by=sort, row_limit=40))

    def device_us(e: Any) -> float:
        return float(getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0.0)))

    def rows(key: Any) -> list[tuple[str, int, float]]:
        ranked = sorted(events, key=key, reverse=True)[:top]
        return [(e.key, int(e.count), round(key(e) / 1e3, 2)) for e in ranked]

    launches = sum(
        int(e.count) for e in events if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC")
    )
    return {"wall_s": round(wall, 3), "kernel_launches": launches if cuda else None,
            "host_ms": rows(lambda e: float(e.self_cpu_time_total)),
            "device_ms": rows(device_us) if cuda else None}  # fmt: skip


def sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


SECTIONS = {"train": section_train, "gate": section_gate, "kernel": section_kernel, "checkpoint": section_checkpoint,
            "lora_step": section_lora_step, "engine": section_engine}  # fmt: skip


if __name__ == "__main__":
    main()
