"""MoE routing replay, side by side: sampler/trainer routing agreement and mismatch KL without and with R3,
and what recording the routing costs the engine.

    python benchmarks/routing.py

Part 1 — an fp32 and a bf16 engine (``rollout.engine.dtype``) each sample 32 episodes (``micro`` preset,
random init, vocab 1536, ~60-token prompts, 48 new tokens, T=1); the fp32 trainer scores them with its own
routing (``none``) and with the engine's (``r3``): the precision options' mismatch, side by side.
Two routers: as initialised, and "near-tied" (every expert's router row = one shared row + 1e-3 noise, as
trained routers can be), where bf16 rounding decides between experts.
Part 2 — engine busy time with routing capture on and off (one engine, capture switched between
alternating rounds; 32 prompts × 64 tokens).
Last line: ``RESULT agreement_none=… agreement_r3=… kl_none=… kl_r3=… kl_fp32=… capture_slowdown=…`` (near-tied
router; all but ``kl_fp32``, the fp32 engine's ``none`` row, are of the bf16 engine).
"""

from __future__ import annotations

import asyncio
import statistics

import torch
from transformers import GptOssForCausalLM

from harmonyrl.algorithms.kl import kl_k3
from harmonyrl.algorithms.losses import masked_token_mean
from harmonyrl.engine.local.engine import LocalEngine
from harmonyrl.engine.local.routing_capture import EngineRouting
from harmonyrl.learn.batch import Batch, collate
from harmonyrl.models.moe_routing import NOT_ROUTED
from harmonyrl.models.tiny_gpt_oss import build_config, build_model
from harmonyrl.rl.routing_replay import routing_metrics
from harmonyrl.rl.targets import no_grad_pass
from harmonyrl.types import Routing, SamplingParams, Trajectory

VOCAB, EPISODES, REPEATS = 1536, 32, 8


def prompts(n: int, lo: int, hi: int, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [
        torch.randint(2, VOCAB, (int(m),), generator=gen).tolist() for m in torch.randint(lo, hi, (n,), generator=gen)
    ]


def generate(engine: LocalEngine, batch: list[list[int]], new_tokens: int) -> list:
    async def go() -> list:
        ps = [SamplingParams(max_new_tokens=new_tokens, seed=i) for i in range(len(batch))]
        return list(await asyncio.gather(*(engine.generate(p, s) for p, s in zip(batch, ps, strict=True))))

    return asyncio.run(go())


def model(near_tied: bool) -> GptOssForCausalLM:
    m = build_model(build_config("micro", VOCAB, 0, 1), seed=0).eval()
    if near_tied:
        with torch.no_grad():
            for layer in m.model.layers:
                w = layer.mlp.router.weight
                w.copy_(w[:1] + 1e-3 * torch.randn(w.shape, generator=torch.Generator().manual_seed(5)))
    return m


def sampled_batch(m: GptOssForCausalLM, dtype: torch.dtype) -> Batch:
    engine = LocalEngine(m, max_batch=EPISODES, max_seq_len=256, dtype=dtype)
    ps = prompts(EPISODES, 50, 70)
    trajs = []
    for p, g in zip(ps, generate(engine, ps, 48), strict=True):
        assert g.routing is not None
        last = torch.full((1, *g.routing.ids.shape[1:]), NOT_ROUTED, dtype=g.routing.ids.dtype)
        n = len(g.token_ids)
        trajs.append(
            Trajectory(
                "t",
                0,
                tuple(p) + g.token_ids,
                (0,) * len(p) + (1,) * n,
                (0.0,) * len(p) + g.logprobs,
                0.0,
                True,
                False,
                None,
                (),
                routing=Routing(torch.cat([g.routing.ids, last])),
            )
        )
    return collate(trajs, pad_id=0)


def replay_table() -> dict[str, float]:
    head = f"{'router':<12}{'engine':<8}{'replay':<8}{'agreement':>11}{'own top-k agr.':>16}{'mismatch KL k3':>16}"
    print(f"{head}{'max |Δ logp|':>14}")
    out: dict[str, float] = {}
    for near_tied in (False, True):
        m = model(near_tied)
        for dtype in (torch.float32, torch.bfloat16):
            batch = sampled_batch(m, dtype)
            for mode in ("none", "r3"):
                logp, _, routed = no_grad_pass(m, batch, replay=mode == "r3")
                met = routing_metrics(batch, routed, int(m.config.num_experts_per_tok))
                kl = float(masked_token_mean(kl_k3(logp, batch.sampler_logprobs), batch.loss_mask))
                gap = float(((logp - batch.sampler_logprobs).abs() * batch.loss_mask).max())
                name, prec = "near-tied" if near_tied else "init", "fp32" if dtype == torch.float32 else "bf16"
                agree, own = met["routing/agreement"], met["routing/agreement_own"]
                print(f"{name:<12}{prec:<8}{mode:<8}{agree:>11.4f}{own:>16.4f}{kl:>16.3e}{gap:>14.2e}")
                if near_tied and prec == "bf16":
                    out[f"agreement_{mode}"], out[f"kl_{mode}"] = agree, kl
                if near_tied and prec == "fp32" and mode == "none":
                    out["kl_fp32"] = kl
    return out


def capture_overhead() -> float:
    """Engine busy time with routing capture on / off: one engine, capture switched between rounds.

    One engine, not two: two identical engines (each with its own copy of the weights) measured up to ~10 %
    apart here, by memory placement alone, which hid the effect. Rounds alternate off/on after a warm-up.
    Returns the ratio of the fastest rounds, on / off.
    """
    m = model(False)
    ps = prompts(EPISODES, 140, 161)
    engine = LocalEngine(m, max_batch=64, max_seq_len=512, record_routing=False)

    def capture(on: bool) -> None:  # private attributes: a benchmark-only switch
        if engine._routing is not None:
            engine._routing.close()
        engine._routing = EngineRouting(engine._model, 64, 512) if on else None

    busy: dict[bool, list[float]] = {False: [], True: []}
    generate(engine, ps, 64)
    for i in range(2 * REPEATS):
        on = i % 2 == 1
        capture(on)
        before = engine.stats.busy_seconds
        generate(engine, ps, 64)
        busy[on].append(engine.stats.busy_seconds - before)
    tokens = EPISODES * 64
    print(f"\n{'engine':<16}{'tokens':>8}{'min busy s':>12}{'median':>9}{'tokens/s (min)':>16}")
    for on, times in busy.items():
        best = min(times)
        name = "capture " + ("on" if on else "off")
        print(f"{name:<16}{tokens:>8}{best:>12.3f}{statistics.median(times):>9.3f}{tokens / best:>16.1f}")
    return min(busy[True]) / min(busy[False])


def main() -> None:
    figures = replay_table()
    slowdown = capture_overhead()
    print(
        f"RESULT agreement_none={figures['agreement_none']:.4f} agreement_r3={figures['agreement_r3']:.4f} "
        f"kl_none={figures['kl_none']:.3e} kl_r3={figures['kl_r3']:.3e} kl_fp32={figures['kl_fp32']:.3e} "
        f"capture_slowdown={slowdown:.3f}"
    )


if __name__ == "__main__":
    main()
