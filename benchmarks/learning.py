"""Does the default `harmonyrl train` learn? Runs it for several seeds and prints success before/after.

    python benchmarks/learning.py [--seeds 3] [--tokenizer o200k_harmony] [key=value ...]

"Success" is held-out pass@1 sampled at the evaluation temperature (the policy as it acts); greedy success
is printed beside it. Over the seeds (:func:`harmonyrl.telemetry.stats.over_seeds`): the mean gain and its standard
error, for pass@1 and for greedy, and whether the gain counts as learned (> +10 points and > 2 SE). Last line:
``RESULT seeds=N mean_before=… mean_after=… mean_minutes=… mean_greedy_before=… mean_greedy_after=… gain=…
gain_se=… greedy_gain=… greedy_gain_se=… learned=true|false``.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from harmonyrl.config import load_config
from harmonyrl.jobs.train import train
from harmonyrl.telemetry.stats import learned, over_seeds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="keep run folders here (default: temp dir)")
    parser.add_argument(
        "--tokenizer", choices=["harmonyrl_bpe", "o200k_harmony"], default=None, help="sets model.tokenizer"
    )
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    console = Console()
    out = args.out or Path(tempfile.mkdtemp(prefix="harmonyrl-learning-"))
    rows = []
    chosen = [f"model.tokenizer={args.tokenizer}"] if args.tokenizer else []
    for seed in range(args.seeds):
        cfg = load_config(None, [*chosen, *args.overrides, f"seed={seed}", f"output_dir={out}", f"run_name=seed{seed}"])
        result = asyncio.run(train(cfg, console))
        r = result
        rows.append((seed, r.success_before, r.success_after, r.minutes, r.greedy_before, r.greedy_after))
    table = Table(title=f"held-out success, {' '.join([*chosen, *args.overrides]) or 'default config'}")
    for col in ("seed", "pass@1 before", "after", "gain (pp)", "greedy before", "after", "gain (pp)", "minutes"):
        table.add_column(col, justify="right")
    for seed, b, a, m, gb, ga in rows:
        gain, ggain = f"{100 * (a - b):+.1f}", f"{100 * (ga - gb):+.1f}"
        table.add_row(str(seed), f"{b:.1%}", f"{a:.1%}", gain, f"{gb:.1%}", f"{ga:.1%}", ggain, f"{m:.1f}")
    console.print(table)
    mb, ma, mm, mgb, mga = (sum(row[i] for row in rows) / len(rows) for i in (1, 2, 3, 4, 5))
    gain = over_seeds({row[0]: row[2] - row[1] for row in rows})
    greedy = over_seeds({row[0]: row[5] - row[4] for row in rows})
    print(
        f"RESULT seeds={len(rows)} mean_before={mb:.3f} mean_after={ma:.3f} mean_minutes={mm:.2f} "
        f"mean_greedy_before={mgb:.3f} mean_greedy_after={mga:.3f} gain={gain.mean:.3f} gain_se={gain.se:.3f} "
        f"greedy_gain={greedy.mean:.3f} greedy_gain_se={greedy.se:.3f} learned={str(learned(gain)).lower()}"
    )


if __name__ == "__main__":
    main()
