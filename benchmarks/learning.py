"""Does the default `harmonyrl train` learn? Runs it for several seeds and prints success before/after.

    python benchmarks/learning.py [--seeds 3] [key=value ...]

Last line: ``RESULT seeds=N mean_before=… mean_after=… mean_minutes=…``.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from harmonyrl.config import load_config
from harmonyrl.trainer.loop import train


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="keep run folders here (default: temp dir)")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    console = Console()
    out = args.out or Path(tempfile.mkdtemp(prefix="harmonyrl-learning-"))
    rows = []
    for seed in range(args.seeds):
        cfg = load_config(
            None, [*args.overrides, f"seed={seed}", f"output_dir={out}", f"run_name=seed{seed}"]
        )
        result = asyncio.run(train(cfg, console))
        rows.append((seed, result.success_before, result.success_after, result.minutes))
    table = Table(title="held-out success, default config")
    for col in ("seed", "before", "after", "gain (pp)", "minutes"):
        table.add_column(col, justify="right")
    for seed, b, a, m in rows:
        table.add_row(str(seed), f"{b:.1%}", f"{a:.1%}", f"{100 * (a - b):+.1f}", f"{m:.1f}")
    console.print(table)
    n = len(rows)
    mb, ma, mm = (sum(r[i] for r in rows) / n for i in (1, 2, 3))
    print(f"RESULT seeds={n} mean_before={mb:.3f} mean_after={ma:.3f} mean_minutes={mm:.2f}")


if __name__ == "__main__":
    main()
