"""Which RL algorithm for the calculator agent? PPO (critic), GRPO, RLOO, REINFORCE++, GSPO and the SAC-style
soft-Q learner, from one shared SFT warm start, with the same seeds and sample budget.

    python benchmarks/compare.py [--seeds 1] [--steps 30] [--out DIR [--reuse]] [key=value ...]

Runs ``harmonyrl compare`` (see ``harmonyrl.jobs.compare``) and prints its table; with ``--reuse`` the finished
warm starts and runs already in ``--out`` (of the same config) are read, not run again, so a stopped comparison
continues. Each seed's arms share its warm start, so the gains (final − warm start) and each arm's difference to the
first are paired by seed: the seeds' warm starts differ far more than the algorithms do. Last line:
``RESULT best=<algo> <algo>_final=<held-out pass@1> <algo>_se=<its SE> <algo>_gain=… <algo>_gain_se=…
<algo>_vs_first=… <algo>_vs_first_se=… ... seeds=N``: SEs are between the seeds with ``--seeds`` ≥ 2 (the documented
run uses 3; ``nan`` for the paired ones with one seed), else the evaluation's task-clustered SE.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

from harmonyrl.cli.common import make_console
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
    parser.add_argument("--reuse", action="store_true", help="read the finished runs already in --out")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="harmonyrl-compare-")) / "compare"
    defaults = [f"rl.steps={args.steps}", f"eval.every={max(1, args.steps // 3)}", "eval.n_tasks=100"]
    cfg = load_config(None, [*defaults, *args.overrides])
    if args.reuse and args.out is None:
        parser.error("--reuse needs --out (the folder of the earlier comparison)")
    algos = parse_algos(args.algos)
    results = asyncio.run(compare(cfg, algos, args.seeds, args.target, out, make_console(), args.reuse))
    best = max(results, key=lambda r: r.final_success)
    finals = " ".join(f"{r.algo}_final={r.final_success:.3f} {r.algo}_se={r.final_se:.3f} {r.algo}_gain={r.gain:.3f} "
                      f"{r.algo}_gain_se={r.gain_se:.3f} {r.algo}_vs_first={r.vs_first:.3f} "
                      f"{r.algo}_vs_first_se={r.vs_first_se:.3f}" for r in results)  # fmt: skip
    print(f"table: {out / 'compare.md'}  plot: {out / 'compare.png'}")
    print(f"RESULT best={best.algo} {finals} seeds={args.seeds}")


if __name__ == "__main__":
    main()
