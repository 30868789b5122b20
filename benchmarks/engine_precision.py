"""Where the embedded engine's bf16 mismatch comes from, on a model with gpt-oss-20b's layer geometry.

    python benchmarks/engine_precision.py [--layers 2] [--prompts 4] [--new 24] [--device cpu]

The GPU check (``scripts/gpu_check.py``'s ``engine`` section, docs/gpu.md) measured, on the H200, a mean k3
KL(sampler ‖ trainer) of 4.8e-3 between the bf16 engine and a bf16 trainer forward on the engine's own samples
(two random layers of 20b's geometry) — about 700× the nano model's. This script takes that measurement apart on
any device, one model (seed 0, weights rounded to bf16 once) and three engines over the same prompts:

* ``bf16`` — the engine in bf16, as the GPU check ran it;
* ``fp32`` — the engine in fp32 on the same (bf16-valued) weights: what is left when the engine's own arithmetic is
  exact; against an fp32 trainer forward it should be ~0 (the engine computes the trainer's function);
* ``bf16_router20`` — bf16, with every router's weights multiplied by 20: routing logits 20× further apart, so
  that bf16 noise rarely flips an expert choice; the part of ``bf16``'s mismatch this removes is routing flips.

Each engine samples ``--prompts`` random 64-token prompts × ``--new`` tokens (temperature 1, seeds 0…), and the
trainer re-scores those samples with a plain forward in bf16 and in fp32: mean k1 and k3 estimates and the largest
|Δ log p| (:func:`mismatch`). Last line: ``RESULT bf16_k3=… fp32_k3_fp32=… router20_k3=… …``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import torch
from transformers import GptOssConfig, GptOssForCausalLM

from harmonyrl.engine.local.engine import LocalEngine
from harmonyrl.models.synthetic import GPT_OSS_20B, scaled
from harmonyrl.types import SamplingParams

ARMS = {"bf16": (torch.bfloat16, 1.0), "fp32": (torch.float32, 1.0), "bf16_router20": (torch.bfloat16, 20.0)}


def mismatch(model: Any, prompts: list[list[int]], gens: list[Any], device: Any) -> tuple[float, float, float]:
    """Mean k1 and k3 KL estimates (sampler ‖ trainer) and the largest |Δ log-prob| over the sampled tokens."""
    k1s, k3s, gaps = [], [], []
    with torch.no_grad():
        for prompt, g in zip(prompts, gens, strict=True):
            ids = torch.tensor([prompt + list(g.token_ids)], device=device)
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
            trainer = torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt) :, None]).squeeze(-1)
            sampler = torch.tensor(g.logprobs, device=device, dtype=torch.float32)
            log_ratio = trainer - sampler  # log p_trainer / p_sampler on the sampler's own samples
            k1s.append((-log_ratio).mean().item())
            k3s.append((log_ratio.exp() - 1 - log_ratio).mean().item())
            gaps.append(log_ratio.abs().max().item())
    return sig(sum(k1s) / len(k1s)), sig(sum(k3s) / len(k3s)), sig(max(gaps))


def sig(x: float) -> float:
    """Three significant figures (a KL of 1e-7 must not print as 0)."""
    return float(f"{x:.3g}")


def sample(model: Any, prompts: list[list[int]], new: int, dtype: torch.dtype, device: torch.device) -> list[Any]:
    """The engine's generations of ``prompts`` (its own copy of the weights in ``dtype``)."""
    engine = LocalEngine(model, max_batch=64, max_seq_len=512, dtype=dtype, kernel="torch", device=device)
    params = [SamplingParams(temperature=1.0, max_new_tokens=new, seed=i) for i in range(len(prompts))]

    async def run() -> list[Any]:
        try:
            return list(await asyncio.gather(*(engine.generate(p, s) for p, s in zip(prompts, params, strict=True))))
        finally:
            await engine.close()

    return asyncio.run(run())


def routers(model: Any) -> dict[str, torch.Tensor]:
    """Every MoE router's weight matrix, by parameter name."""
    return {name: p for name, p in model.named_parameters() if name.endswith("router.weight")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--new", type=int, default=24, help="tokens sampled per prompt")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    if args.layers < 1 or args.prompts < 1 or args.new < 1:
        raise SystemExit("engine_precision: --layers, --prompts and --new must be positive")
    device = torch.device(args.device)
    config = GptOssConfig(**scaled(GPT_OSS_20B, num_hidden_layers=args.layers))
    del config.quantization_config
    torch.manual_seed(0)
    model = GptOssForCausalLM(config)
    torch.nn.Module.to(model, device=device, dtype=torch.bfloat16)  # in place; transformers wraps .to
    model.eval()
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, config.vocab_size - 2, (64,), generator=gen).tolist() for _ in range(args.prompts)]
    figures: dict[str, float] = {}
    original = {name: p.detach().clone() for name, p in routers(model).items()}
    for arm, (engine_dtype, factor) in ARMS.items():
        start = time.monotonic()
        with torch.no_grad():
            for name, p in routers(model).items():
                p.copy_(original[name] * factor)
        gens = sample(model, prompts, args.new, engine_dtype, device)
        for trainer_dtype in (torch.bfloat16, torch.float32):
            torch.nn.Module.to(model, dtype=trainer_dtype)
            k1, k3, gap = mismatch(model, prompts, gens, device)
            name = "bf16" if trainer_dtype == torch.bfloat16 else "fp32"
            figures.update({f"{arm}_k1_{name}": k1, f"{arm}_k3_{name}": k3, f"{arm}_gap_{name}": gap})
        torch.nn.Module.to(model, dtype=torch.bfloat16)
        row = {k.removeprefix(f"{arm}_"): v for k, v in figures.items() if k.startswith(f"{arm}_")}
        print(f"{arm}: {row} ({time.monotonic() - start:.0f} s)", flush=True)
    print("RESULT " + " ".join(f"{k}={v}" for k, v in figures.items()) + f" layers={args.layers} "
          f"prompts={args.prompts} new={args.new} device={device.type}")  # fmt: skip


if __name__ == "__main__":
    main()
