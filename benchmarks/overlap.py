"""Async agent loop vs lock-step rollouts when tools take heavy-tailed time.

Every episode has ``--turns`` turns: generate ``--tokens`` tokens with the embedded engine, then call a
blocking tool whose latency is log-normal (median 0.5 s, sigma 1.2: a few calls take over 5 s). The tool is a
real :class:`~harmonyrl.envs.tools.Tool` around ``time.sleep``, so it runs off the event loop exactly as a
sync tool does in the agent loop. The same episodes (same latencies, same
seeds) run two ways in one process:

* async     — one asyncio task per episode, up to ``--in-flight`` episodes at once; the engine batches
              whatever generation requests are pending (continuous batching);
* lock-step — waves of ``--in-flight`` episodes: everyone generates, then everyone runs tools, then the next
              turn (the classic synchronous rollout). Its rate is the same wave after wave, so it runs on the
              first ``--lockstep-waves`` waves of the same episodes to keep the benchmark short.

Prompts are 128 tokens whose first 96 are shared by every episode (``--shared-prefix``), as an environment's
system + developer messages are; ``--shared-prefix 0`` gives fully random prompts.

Engine busy is the engine's own time (``EngineStats.busy_seconds``: whole steps, from admitting requests
through the model and sampling to resolving finished ones); the model and sampler alone are printed as
``compute``. The issue's own measure, the time the engine *had work* (requests queued or running), is printed
as ``had work``: it also counts the agents' turns on the shared thread while requests wait. Busy is only
meaningful when the engine is the bottleneck, i.e. when the total generation work is
much longer than the slowest single episode: hence many episodes. Two figures are printed:

* ``engine_busy`` — over the steady state, from the start until the last episode enters (``--in-flight``
  episodes are in flight the whole time): the goal's "once enough episodes are in flight";
* ``engine_busy_all`` — over the whole async wall time, including the drain at the end, when fewer and
  fewer episodes remain and the last slow tool calls run with nothing left to generate.

Prints episodes/s for both modes. Last line:
``RESULT async_vs_lockstep=… engine_busy=… engine_busy_all=… engine_had_work=…``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from dataclasses import dataclass

import torch

from harmonyrl.engine.local.engine import LocalEngine
from harmonyrl.envs.tools import Tool
from harmonyrl.models.tiny_gpt_oss import build_config, build_model
from harmonyrl.types import SamplingParams


def latencies(n: int, turns: int, seed: int, median: float, sigma: float) -> list[list[float]]:
    rng = random.Random(seed)
    return [[median * rng.lognormvariate(0.0, sigma) for _ in range(turns)] for _ in range(n)]


def prompts(n: int, vocab: int, length: int, shared: int, seed: int) -> list[list[int]]:
    """``n`` prompts of ``length`` tokens whose first ``shared`` tokens are common to all (an agent env's
    system + developer messages, as in real episodes), the rest random."""
    g = torch.Generator().manual_seed(seed)
    head = torch.randint(3, vocab, (shared,), generator=g).tolist()
    return [head + row for row in torch.randint(3, vocab, (n, length - shared), generator=g).tolist()]


async def _turn(engine: LocalEngine, ids: list[int], tokens: int, seed: int) -> list[int]:
    gen = await engine.generate(ids, SamplingParams(max_new_tokens=tokens, seed=seed))
    return ids + list(gen.token_ids)


def sandbox_call(seconds: float) -> str:
    """A blocking sandbox call that takes ``seconds``."""
    time.sleep(seconds)
    return "done"


SANDBOX = Tool.from_function(sandbox_call, timeout_s=3600)


async def _tool(delay: float, obs: list[int]) -> list[int]:
    outcome = await SANDBOX.call(json.dumps({"seconds": delay}))
    assert outcome.kind == "ok", outcome
    return obs


@dataclass
class AsyncRun:
    wall_s: float
    steady_s: float
    """Seconds from the start until the last episode entered (episodes in flight == ``in_flight`` throughout)."""
    steady_busy_s: float
    """Engine busy seconds within that window."""
    steady_compute_s: float
    """The model's and sampler's part of them."""
    steady_idle_s: float
    """Seconds in that window the engine had nothing queued or running."""


async def run_async(
    engine: LocalEngine, ps: list[list[int]], lat: list[list[float]], tokens: int, in_flight: int
) -> AsyncRun:
    gate = asyncio.Semaphore(in_flight)
    stats = engine.stats
    busy0, compute0, idle0 = stats.busy_seconds, stats.compute_seconds, stats.settled().idle_seconds
    steady = [0.0, 0.0, 0.0, 0.0]

    async def episode(i: int) -> None:
        async with gate:
            if i == len(ps) - 1:  # the last one enters: from here on fewer and fewer are in flight
                steady[:] = [
                    time.perf_counter() - t0,
                    stats.busy_seconds - busy0,
                    stats.compute_seconds - compute0,
                    stats.settled().idle_seconds - idle0,
                ]
            ids = ps[i]
            for t, delay in enumerate(lat[i]):
                ids = await _turn(engine, ids, tokens, seed=i * 100 + t)
                ids = ids + await _tool(delay, [5, 6, 7, 8])

    t0 = time.perf_counter()
    await asyncio.gather(*(episode(i) for i in range(len(ps))))
    return AsyncRun(time.perf_counter() - t0, *steady)


async def run_lockstep(
    engine: LocalEngine, ps: list[list[int]], lat: list[list[float]], tokens: int, in_flight: int
) -> float:
    t0 = time.perf_counter()
    for start in range(0, len(ps), in_flight):
        wave = list(range(start, min(start + in_flight, len(ps))))
        ids = {i: ps[i] for i in wave}
        for t in range(len(lat[0])):
            outs = await asyncio.gather(*(_turn(engine, ids[i], tokens, seed=i * 100 + t) for i in wave))
            ids = dict(zip(wave, outs, strict=True))
            obs = await asyncio.gather(*(_tool(lat[i][t], [5, 6, 7, 8]) for i in wave))
            ids = {i: ids[i] + o for i, o in zip(wave, obs, strict=True)}
    return time.perf_counter() - t0


async def main_async(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    vocab = 1536
    model = build_model(build_config("micro", vocab, 0, 1), seed=0).eval()
    engine = LocalEngine(model, max_batch=args.slots, max_seq_len=1024)
    ps = prompts(args.episodes, vocab, args.prompt_len, args.shared_prefix, seed=1)
    lat = latencies(args.episodes, args.turns, seed=2, median=0.5, sigma=1.2)
    flat = sorted(x for row in lat for x in row)
    print(
        f"tool latency: median {flat[len(flat) // 2]:.2f}s  p99 {flat[int(0.99 * len(flat))]:.2f}s  "
        f"max {flat[-1]:.2f}s  >5s: {sum(x > 5 for x in flat)} of {len(flat)} calls"
    )
    await run_async(engine, ps[:8], lat[:8], 4, 8)  # warm-up
    busy0 = engine.stats.busy_seconds
    run = await run_async(engine, ps, lat, args.tokens, args.in_flight)
    wall_async = run.wall_s
    busy_all = (engine.stats.busy_seconds - busy0) / wall_async
    busy = run.steady_busy_s / run.steady_s
    n_lock = min(args.episodes, args.lockstep_waves * args.in_flight)
    wall_lock = await run_lockstep(engine, ps[:n_lock], lat[:n_lock], args.tokens, args.in_flight)
    await engine.close()
    eps_async, eps_lock = args.episodes / wall_async, n_lock / wall_lock
    print(f"{'mode':<10}{'episodes':>10}{'wall s':>10}{'episodes/s':>12}")
    print(f"{'async':<10}{args.episodes:>10}{wall_async:>10.1f}{eps_async:>12.2f}")
    print(f"{'lock-step':<10}{n_lock:>10}{wall_lock:>10.1f}{eps_lock:>12.2f}")
    print(
        f"engine busy (async): {busy:.1%} of the first {run.steady_s:.1f} s (until the last episode entered), "
        f"{busy_all:.1%} of the whole {wall_async:.1f} s; model + sampling alone: "
        f"{run.steady_compute_s / run.steady_s:.1%} of the first"
    )
    had_work = 1 - run.steady_idle_s / run.steady_s
    print(f"engine had work (requests queued or running): {had_work:.1%} of the first {run.steady_s:.1f} s")
    print(
        f"RESULT async_vs_lockstep={eps_async / eps_lock:.2f} engine_busy={busy:.3f} engine_busy_all={busy_all:.3f} "
        f"engine_had_work={had_work:.3f}"
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--episodes", type=int, default=1536)
    p.add_argument("--in-flight", type=int, default=128, help="episodes in flight at once")
    p.add_argument("--lockstep-waves", type=int, default=3, help="waves of --in-flight episodes run lock-step")
    p.add_argument("--slots", type=int, default=64, help="engine batch slots")
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--tokens", type=int, default=64, help="tokens generated per turn")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--shared-prefix", type=int, default=96, help="prompt tokens common to every episode (0: none)")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    if args.episodes <= args.in_flight:  # no steady state: the last episode would enter at the start
        p.error(f"--episodes ({args.episodes}) must exceed --in-flight ({args.in_flight})")
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
