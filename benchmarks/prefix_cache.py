"""The engine's prefix cache on multi-turn agent conversations, on vs off, side by side.

    python benchmarks/prefix_cache.py

64 conversations (``micro`` preset, random init, vocab 1536) of 3 turns: a prompt of a 96-token head shared
by all (an environment's system + developer messages) plus 32 tokens of its own; each turn samples 48 tokens
(T=1), then an 8-token "tool result" is appended and the whole conversation is sent again, as the agent loop
does (token in, token out). All 64 run concurrently, turn by turn, so the engine work is the only cost.
Two engines on the same model: ``prefix_cache_mib=256`` (the default) and ``0`` (off); they alternate for
``REPEATS`` rounds after a warm-up, and the median round is reported. Also printed: prompt tokens the engine
prefilled vs reused, and how many sampled tokens the two engines agree on (the cached keys/values of a
finished turn come from the decode path, equal to the prefill path's to fp32 rounding, so a sampled token can
change only at a near-tie).
Last line: ``RESULT prefix_cache_speedup=… prefill_tokens_ratio=… same_tokens=…``. ``--quick``: 16 conversations,
one round (a smoke test).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import torch

from harmonyrl.engine.local.engine import LocalEngine
from harmonyrl.models.tiny_gpt_oss import build_config, build_model
from harmonyrl.types import SamplingParams

VOCAB, CONVERSATIONS, TURNS, HEAD, OWN, NEW_TOKENS, TOOL, REPEATS = 1536, 64, 3, 96, 32, 48, 8, 3


def first_prompts(seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    head = torch.randint(2, VOCAB, (HEAD,), generator=gen).tolist()
    return [head + torch.randint(2, VOCAB, (OWN,), generator=gen).tolist() for _ in range(CONVERSATIONS)]


def converse(engine: LocalEngine, prompts: list[list[int]]) -> tuple[float, list[int], int]:
    """Run every conversation ``TURNS`` turns; returns (seconds, every sampled token, prompt tokens sent)."""

    async def go() -> tuple[list[int], int]:
        ids, sampled, sent = [list(p) for p in prompts], [], 0
        for turn in range(TURNS):
            params = [SamplingParams(max_new_tokens=NEW_TOKENS, seed=100 * i + turn) for i in range(len(ids))]
            sent += sum(len(p) for p in ids)
            gens = await asyncio.gather(*(engine.generate(p, s) for p, s in zip(ids, params, strict=True)))
            tool = [2 + (7 * turn + j) % (VOCAB - 2) for j in range(TOOL)]
            ids = [p + list(g.token_ids) + tool for p, g in zip(ids, gens, strict=True)]
            sampled += [t for g in gens for t in g.token_ids]
        return sampled, sent

    start = time.perf_counter()
    sampled, sent = asyncio.run(go())
    return time.perf_counter() - start, sampled, sent


def main() -> None:
    global CONVERSATIONS, REPEATS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="16 conversations, one round: a smoke test")
    if parser.parse_args().quick:
        CONVERSATIONS, REPEATS = 16, 1
    model = build_model(build_config("micro", VOCAB, 0, 1), seed=0).eval()
    prompts = first_prompts()
    engines = {
        "cache on (256 MiB)": LocalEngine(model, max_batch=CONVERSATIONS, max_seq_len=512),
        "cache off (0)": LocalEngine(model, max_batch=CONVERSATIONS, max_seq_len=512, prefix_cache_mib=0),
    }
    times: dict[str, list[float]] = {name: [] for name in engines}
    tokens: dict[str, list[int]] = {}
    reused: dict[str, int] = {}
    for engine in engines.values():
        converse(engine, prompts)  # warm-up (and the cache-on engine's cache is cleared below)
    for _ in range(REPEATS):
        for name, engine in engines.items():
            engine.load_weights(model.state_dict())  # same weights; drops the cache, so every round starts cold
            before = engine.stats.prefix_tokens_reused
            seconds, tokens[name], sent = converse(engine, prompts)
            times[name].append(seconds)
            reused[name] = engine.stats.prefix_tokens_reused - before
    print(f"{CONVERSATIONS} conversations x {TURNS} turns x {NEW_TOKENS} tokens; prompt tokens sent: {sent}")
    print(f"{'engine':<22}{'seconds':>9}{'tokens/s':>10}{'prefilled':>11}{'reused':>9}")
    for name in engines:
        secs = statistics.median(times[name])
        prefilled = sent - reused[name]
        print(f"{name:<22}{secs:>9.3f}{len(tokens[name]) / secs:>10.1f}{prefilled:>11}{reused[name]:>9}")
    on, off = (statistics.median(times[name]) for name in engines)
    names = list(engines)
    same = sum(a == b for a, b in zip(tokens[names[0]], tokens[names[1]], strict=True)) / len(tokens[names[0]])
    ratio = (sent - reused[names[0]]) / (sent - reused[names[1]])
    print(f"RESULT prefix_cache_speedup={off / on:.2f} prefill_tokens_ratio={ratio:.3f} same_tokens={same:.4f}")


if __name__ == "__main__":
    main()
