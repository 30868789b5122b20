"""Which RL algorithm for the calculator agent? PPO (critic), GRPO, RLOO, REINFORCE++, GSPO and the SAC-style
soft-Q learner, from one shared SFT warm start, with the same seeds and sample budget.

    python benchmarks/compare.py [--seeds 1] [--steps 30] [--out DIR] [key=value ...]

Runs ``harmonyrl compare`` (see ``harmonyrl.jobs.compare``) and prints its table. Last line:
``RESULT best=<algo> <algo>_final=<held-out pass@1> <algo>_se=<its SE> ... seeds=N``: the SE is between the seeds
with ``--seeds`` ≥ 2 (the documented run uses 3), else the evaluation's task-clustered SE.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

from rich.console import Console

from harmonyrl.config import load_config
from harmonyrl.jobs.compare import compare, parse_algos

ALGOS = "ppo,grpo,rloo,reinforce_pp,gspo,sac"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--algos", default=ALGOS)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--steps", type=int, default=30, help="RL steps per algorithm (the sample budget)")
    parser.add_argument("--target", type=float, default=0.5)
    parser.add_argument("--out", type=Path, default=None, help="keep the runs here (default: a temp dir)")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="harmonyrl-compare-")) / "compare"
    defaults = [f"rl.steps={args.steps}", f"eval.every={max(1, args.steps // 3)}", "eval.n_tasks=100"]
    cfg = load_config(None, [*defaults, *args.overrides])
    results = asyncio.run(compare(cfg, parse_algos(args.algos), args.seeds, args.target, out, Console()))
    best = max(results, key=lambda r: r.final_success)
    finals = " ".join(f"{r.algo}_final={r.final_success:.3f} {r.algo}_se={r.final_se:.3f}" for r in results)
    print(f"table: {out / 'compare.md'}  plot: {out / 'compare.png'}")
    print(f"RESULT best={best.algo} {finals} seeds={args.seeds}")


if __name__ == "__main__":
    main()
