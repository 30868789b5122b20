"""Embedded engine vs transformers ``generate``: same model, same prompts, same sampling settings.

Tiny GPT-OSS (``micro`` preset, vocab 1536, random init), 32 prompts of ~150 tokens, temperature 1,
64 new tokens, no stop ids (so every run produces exactly 32 × 64 tokens). (a) HF ``model.generate`` batched
with left padding and ``do_sample=True``; (b) ``LocalEngine`` as ``harmonyrl train`` builds it
(``rollout.engine.kernel=auto``: the compiled decode step where it is built), all 32 requests submitted concurrently;
(c) the same engine with its eager torch decode step (``rollout.engine.kernel=torch``), to show what the compiled step
adds. All are warmed up, then timed 7 times in alternation; the medians are compared (the host's speed drifts by
1.5x within minutes, so fewer rounds let one slow round decide).
Last line: ``RESULT engine_vs_hf=<(b)/(a)> kernel=<native|torch> torch_kernel_vs_hf=<(c)/(a)>``. ``--quick``: 8 prompts
× 16 tokens, 3 rounds (a smoke test).

Run: ``python benchmarks/engine.py``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Callable

import torch
from transformers import GptOssForCausalLM

from harmonyrl.engine.local.engine import LocalEngine
from harmonyrl.models.tiny_gpt_oss import build_config, build_model
from harmonyrl.types import SamplingParams

NUM_PROMPTS, NEW_TOKENS, VOCAB, PAD, EOS, REPEATS = 32, 64, 1536, 0, 1, 7


def make_prompts(seed: int = 0) -> list[list[int]]:
    """32 prompts of 140..160 tokens (ids avoid pad/eos)."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(140, 161, (NUM_PROMPTS,), generator=gen).tolist()
    return [torch.randint(2, VOCAB, (n,), generator=gen).tolist() for n in lengths]


def run_hf(model: GptOssForCausalLM, prompts: list[list[int]]) -> int:
    """Batched HF sampling with left padding; returns the number of generated tokens."""
    longest = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), longest), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, longest - len(p) :] = torch.tensor(p)
        mask[i, longest - len(p) :] = 1
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS,
            pad_token_id=PAD,
            eos_token_id=None,
        )
    return (out.shape[1] - longest) * len(prompts)


def run_engine(engine: LocalEngine, prompts: list[list[int]]) -> int:
    """All requests submitted concurrently; returns the number of generated tokens."""
    params = [SamplingParams(temperature=1.0, max_new_tokens=NEW_TOKENS, seed=i) for i in range(len(prompts))]

    async def go() -> int:
        gens = await asyncio.gather(*(engine.generate(p, s) for p, s in zip(prompts, params, strict=True)))
        return sum(len(g.token_ids) for g in gens)

    return asyncio.run(go())


def measure(runs: dict[str, Callable[[], int]]) -> dict[str, tuple[int, float]]:
    """Warm each up once, then interleave ``REPEATS`` timed rounds (fair under noisy neighbours);
    returns ``name -> (tokens, median seconds)``."""
    for fn in runs.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in runs}
    tokens: dict[str, int] = {}
    for _ in range(REPEATS):
        for name, fn in runs.items():
            start = time.perf_counter()
            tokens[name] = fn()
            times[name].append(time.perf_counter() - start)
    return {name: (tokens[name], statistics.median(times[name])) for name in runs}


def main() -> None:
    global NUM_PROMPTS, NEW_TOKENS, REPEATS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8 prompts x 16 tokens, 3 rounds: a smoke test")
    if parser.parse_args().quick:
        NUM_PROMPTS, NEW_TOKENS, REPEATS = 8, 16, 3
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", os.cpu_count() or 1)))
    config = build_config("micro", VOCAB, PAD, EOS)
    model = build_model(config, seed=0).eval()
    prompts = make_prompts()
    engine = LocalEngine(model, max_batch=64, max_seq_len=512)
    eager = LocalEngine(model, max_batch=64, max_seq_len=512, kernel="torch")
    name = f"LocalEngine ({engine.kernel})"

    results = measure(
        {
            "transformers generate": lambda: run_hf(model, prompts),
            name: lambda: run_engine(engine, prompts),
            "LocalEngine (torch)": lambda: run_engine(eager, prompts),
        }
    )
    asyncio.run(engine.close())
    asyncio.run(eager.close())
    (hf_tokens, hf_s), (eng_tokens, eng_s) = results["transformers generate"], results[name]
    torch_tokens, torch_s = results["LocalEngine (torch)"]
    rows = [(name, tok, sec) for name, (tok, sec) in results.items()]
    print(f"threads={torch.get_num_threads()} prompts={NUM_PROMPTS} new_tokens={NEW_TOKENS} repeats={REPEATS}")
    print(f"{'implementation':<24}{'tokens':>8}{'seconds':>10}{'tokens/s':>11}")
    for label, tokens, seconds in rows:
        print(f"{label:<24}{tokens:>8}{seconds:>10.3f}{tokens / seconds:>11.1f}")
    stats = engine.stats
    runs, rest = REPEATS + 1, stats.compute_seconds - stats.prefill_seconds
    print(
        f"{name} (warm-up + {REPEATS} runs): steps={stats.steps} mean_batch={stats.mean_batch_size:.1f} "
        f"compute_s={stats.compute_seconds:.3f} tokens={stats.tokens_generated}; per run: prefill "
        f"{stats.prefill_seconds / runs:.3f} s, decode + sampling {rest / runs:.3f} s "
        f"({rest / (stats.steps - runs) * 1e3:.2f} ms per step)"
    )
    ratio = (eng_tokens / eng_s) / (hf_tokens / hf_s)
    torch_ratio = (torch_tokens / torch_s) / (hf_tokens / hf_s)
    print(f"RESULT engine_vs_hf={ratio:.2f} kernel={engine.kernel} torch_kernel_vs_hf={torch_ratio:.2f}")


if __name__ == "__main__":
    main()
