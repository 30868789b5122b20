"""The GPT-OSS mismatch story, reproduced: what a sink-less training kernel does to RL, and what cures it.

    python benchmarks/mismatch.py [--steps 30] [--out DIR] [key=value ...]

One SFT warm start, then three RL runs with equal seeds and budget:
  (a) sink-aware engine, sink-less trainer, no correction — the bug of the public retrospective;
  (b) the same, with sequence-level truncated importance sampling (rollout correction);
  (c) matched sink-correct kernels (the fused exact sink kernel in the trainer).
Writes ``mismatch.png`` (mismatch KL, grad norm and reward per step for the three) and ``mismatch.md``.
Last line: ``RESULT a_final=… b_final=… c_final=… a_kl=… c_kl=…`` (held-out pass@1, mean k3 mismatch KL).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from rich.console import Console
from rich.table import Table

from harmonyrl.config import load_config
from harmonyrl.jobs.train import sft_only, train

VARIANTS: dict[str, tuple[str, list[str]]] = {
    "a": ("sink-less trainer, no correction", ["model.attention=harmonyrl_sinkless"]),
    "b": (
        "sink-less trainer + sequence-level TIS",
        [
            "model.attention=harmonyrl_sinkless",
            "rl.correction.weights.mode=truncate",
            "rl.correction.weights.level=sequence",
        ],
    ),
    "c": ("matched sink kernels", ["model.attention=harmonyrl_sink_sdpa"]),
}


def _rows(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    console = Console()
    out = args.out or Path(tempfile.mkdtemp(prefix="harmonyrl-mismatch-"))
    base = [f"output_dir={out}", f"rl.steps={args.steps}", "eval.n_tasks=100", *args.overrides]
    warm = asyncio.run(sft_only(load_config(None, [*base, "run_name=sft"]), console))
    runs: dict[str, list[dict[str, Any]]] = {}
    for key, (label, extra) in VARIANTS.items():
        console.rule(f"({key}) {label}")
        cfg = load_config(None, [*base, *extra, f"model.init_from={warm}", "sft.steps=0", f"run_name={key}"])
        runs[key] = _rows(asyncio.run(train(cfg, console)).run_dir)

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    panels = (("mismatch/kl_k3", "mismatch KL (k3)", True), ("train/grad_norm", "grad norm (pre-clip)", True),
              ("rollout/reward", "rollout reward", False))  # fmt: skip
    summary = {}
    for key, rows in runs.items():
        rl = [r for r in rows if r["phase"] == "rl" and "mismatch/kl_k3" in r]
        evals = [r for r in rows if r["phase"] == "eval"]
        for ax, (metric, title, log) in zip(axes, panels, strict=True):
            ax.plot([r["step"] for r in rl], [max(r[metric], 1e-12) for r in rl], label=f"({key}) {VARIANTS[key][0]}")
            ax.set_title(title)
            ax.set_xlabel("RL step")
            if log:
                ax.set_yscale("log")
        summary[key] = {
            "before": evals[0]["eval/success"],
            "final": evals[-1]["eval/success"],
            "kl": sum(r["mismatch/kl_k3"] for r in rl) / max(1, len(rl)),
            "grad": max((r["train/grad_norm"] for r in rl), default=0.0),
            "ess": sum(r["mismatch/ess_seq"] for r in rl) / max(1, len(rl)),
        }
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "mismatch.png", dpi=110)
    table = Table(title=f"mismatch experiment: {args.steps} RL steps from one warm start")
    for col in ("run", "held-out pass@1 before → after", "mean mismatch KL (k3)", "max grad norm", "mean seq ESS"):
        table.add_column(col, justify="right")
    lines = [
        "| run | pass@1 before → after | mean mismatch KL (k3) | max grad norm | mean seq ESS |",
        "|---|---|---|---|---|",
    ]
    for key, s in summary.items():
        cells = [f"({key}) {VARIANTS[key][0]}", f"{s['before']:.1%} → {s['final']:.1%}", f"{s['kl']:.2e}",
                 f"{s['grad']:.2f}", f"{s['ess']:.3f}"]  # fmt: skip
        table.add_row(*cells)
        lines.append("| " + " | ".join(cells) + " |")
    console.print(table)
    (out / "mismatch.md").write_text("\n".join(lines) + "\n")
    print(f"plot: {out / 'mismatch.png'}  table: {out / 'mismatch.md'}")
    s = summary
    print(
        f"RESULT a_final={s['a']['final']:.3f} b_final={s['b']['final']:.3f} c_final={s['c']['final']:.3f} "
        f"a_kl={s['a']['kl']:.3e} c_kl={s['c']['kl']:.3e}"
    )


if __name__ == "__main__":
    main()
