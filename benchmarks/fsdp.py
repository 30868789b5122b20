"""Time of one RL update of the learner in one process and sharded over N processes (FSDP2, torchrun).

    python benchmarks/fsdp.py [--processes 2] [--preset micro] [--episodes 32] [--length 256] [--updates 4]

Runs the same synthetic batch (``--episodes`` episodes of ``--length`` tokens, 4 groups, mixed rewards) through
``Learner.update`` with the default RL config, first in this process (the CPU's cores as threads), then under
``torchrun --nproc_per_node N`` (the cores shared out: ``cores // N`` threads each), and reports the median
update time of each after one warm-up update; the single process is also timed with ``cores // N`` threads,
the fair baseline on a loaded CPU (where a team of OpenMP threads loses far more than its share,
docs/contention.md). The machine's load average is printed before and after: on a shared CPU the figures move
with it. Last line: ``RESULT processes=1,1,N threads=…,…,… update_s=…,…,… speedup=…`` (speed-up of N processes
over one process with all the cores).
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

import torch


def _batch(episodes: int, length: int) -> list:  # type: ignore[type-arg]
    from harmonyrl.types import Trajectory

    out = []
    for i in range(episodes):
        g = torch.Generator().manual_seed(i)
        n = length - (i % 7) * 8  # some padding
        ids = tuple(torch.randint(1, 1000, (n,), generator=g).tolist())
        mask = (0,) * 64 + (1,) * (n - 64)
        out.append(Trajectory(f"t{i % 4}", i % 4, ids, mask, (-1.0,) * n, float(i % 3 == 0), True, False, None, ()))
    return out


def worker(args: argparse.Namespace) -> None:
    """One process of the measurement (rank 0 of a torchrun launch writes the times)."""
    from harmonyrl.config import RLConfig
    from harmonyrl.distributed.world import join, leave, share_cores
    from harmonyrl.models.tiny_gpt_oss import build_config, build_model
    from harmonyrl.rl.learner import Learner

    torch.use_deterministic_algorithms(True, warn_only=True)
    world = join()
    share_cores(world, args.threads)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    model = build_model(build_config(args.preset, 1024, 0, 1), seed=0)
    learner = Learner.create(RLConfig(), model, pad_id=0, norm=float(args.length), seed=0, world=world)
    batch = _batch(args.episodes, args.length)
    times = []
    for _ in range(args.updates + 1):
        t0 = time.perf_counter()
        learner.update(batch)
        times.append(time.perf_counter() - t0)
    if world.is_main:
        Path(args.out).write_text(json.dumps({"update_s": times[1:], "threads": torch.get_num_threads()}))
    leave(world)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--preset", default="micro")
    p.add_argument("--episodes", type=int, default=32)
    p.add_argument("--length", type=int, default=256)
    p.add_argument("--updates", type=int, default=4)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--out", default="")
    args = p.parse_args()
    if args.out:
        return worker(args)
    here = [sys.argv[0], "--preset", args.preset, "--episodes", str(args.episodes), "--length", str(args.length),
            "--updates", str(args.updates)]  # fmt: skip
    medians, threads = [], []
    print(f"load average before: {os.getloadavg()[0]:.1f}")
    few = max(1, (os.cpu_count() or 1) // args.processes)
    for n, fixed in ((1, 0), (1, few), (args.processes, 0)):
        out = Path(f"/tmp/harmonyrl-fsdp-bench-{n}-{fixed}.json")
        launch = [sys.executable] if n == 1 else [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node",
                                                  str(n)]  # fmt: skip
        subprocess.run([*launch, *here, "--threads", str(fixed), "--out", str(out)], check=True, capture_output=True)
        got = json.loads(out.read_text())
        medians.append(statistics.median(got["update_s"]))
        threads.append(got["threads"])
        times = ", ".join(f"{t:.2f}" for t in got["update_s"])
        print(f"{n} process(es), {got['threads']} thread(s) each: update {medians[-1]:.2f} s (median of {times})")
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    print(f"RESULT processes=1,1,{args.processes} threads={','.join(map(str, threads))} "
          f"update_s={','.join(f'{m:.2f}' for m in medians)} speedup={medians[0] / medians[2]:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
