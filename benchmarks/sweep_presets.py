"""Is a sweep's winner better than the default, or only selected on noise? And which trial makes which preset?

    python benchmarks/sweep_presets.py --study DIR [--default-run RUN] [--top 3] [--seeds 1,2] [--out DIR]
        [--target 0.45] [key=value ...]

The study is a finished ``harmonyrl sweep`` folder. A sweep selects on its own held-out figure (every trial trains
and evaluates with the same seed), so its best value is biased upwards. This re-runs, one after another, the default
(the study's base config: every searched key at its default) and the study's ``--top`` completed trials with other
``--seeds``, each a plain ``harmonyrl train`` process from the same warm start (``key=value`` overrides are added to
every arm, e.g. ``eval.n_tasks=200`` for a larger held-out set). A run whose ``summary.json`` exists is not re-run,
so the script continues where it stopped.

Reported per arm: the study's figure (seed of the study), the held-out pass@1 after RL at each seed, their mean and
worst case, and the RL episodes until the periodic held-out pass@1 first reached ``--target`` (mean over the seeds
that reached it; ``eval.every`` sets the resolution). Success figures are deterministic given the seed; minutes
depend on the machine's load. Writes ``confirm.md`` and ``confirm.png`` in ``--out``. Last line:
``RESULT study_best=… study_default=… confirm_best=… confirm_default=… fast=… stable=…`` (``fast``: the arm with the
fewest episodes to the target, every seed reaching it; ``stable``: the best worst case over the seeds).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from harmonyrl.config import RunConfig, dump_config, load_config
from harmonyrl.sweep.outputs import TrialRow, rows
from harmonyrl.sweep.space import Scalar, override
from harmonyrl.sweep.study import Sweep, load_study, open_sweep


@dataclass(frozen=True)
class Arm:
    """One config to re-run: ``default`` or ``trial_N`` with the trial's searched values."""

    name: str
    params: dict[str, Scalar]
    study_value: float


@dataclass(frozen=True)
class RunResult:
    """One finished run: held-out pass@1 at each evaluated RL step (0 = before RL), minutes, episodes per step."""

    curve: dict[int, float]
    minutes: float
    episodes_per_step: int

    @property
    def final(self) -> float:
        return self.curve[max(self.curve)]

    def episodes_to(self, target: float) -> float:
        """RL episodes until the held-out pass@1 first reached ``target`` (nan when it never did)."""
        steps = [s for s, v in sorted(self.curve.items()) if v >= target]
        return float(steps[0] * self.episodes_per_step) if steps else math.nan


def arms(sweep: Sweep, top: int, default_run: Path | None) -> list[Arm]:
    """The default (its study figure: ``default_run``'s, a run of the base config at the study's seed) and the
    ``top`` completed trials of the study, best first."""
    done = [r for r in rows(load_study(sweep)) if r.state == "complete" and r.value is not None]
    done.sort(key=lambda r: -(r.value or 0.0))
    best = [Arm(f"trial_{r.number}", dict(r.params), r.value or 0.0) for r in done[:top]]
    value = math.nan
    if default_run is not None:
        value = float(json.loads((default_run / "summary.json").read_text())["success_after"])
    return [Arm("default", {}, value), *best]


def run_arm(sweep: Sweep, arm: Arm, seed: int, out: Path, extra: list[str]) -> RunResult:
    """Train ``arm`` with ``seed`` (unless its run folder already holds a summary) and read its results."""
    name = f"{arm.name}_s{seed}"
    run = out / name
    if not (run / "summary.json").is_file():
        own = [f"seed={seed}", f"output_dir={out}", f"run_name={name}"]
        cfg: RunConfig = sweep.config([*(override(k, v) for k, v in arm.params.items()), *extra, *own])
        path = out / f"{name}.yaml"
        path.write_text(dump_config(cfg), encoding="utf-8")
        with (out / f"{name}.log").open("w") as log:
            cmd = [sys.executable, "-m", "harmonyrl.cli", "train", "-c", str(path), "--overwrite"]
            subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=True, env=dict(os.environ))
    return read_run(run)


def read_run(run: Path) -> RunResult:
    """A finished run folder's held-out curve (``metrics.jsonl``) and minutes (``summary.json``)."""
    curve: dict[int, float] = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "eval/success" in row and row.get("phase") in ("eval", "rl"):
            curve[int(row["step"])] = float(row["eval/success"])
    cfg = load_config(run / "config.yaml")
    per_step = cfg.rollout.tasks_per_step * cfg.rollout.group_size
    minutes = float(json.loads((run / "summary.json").read_text())["minutes"])
    return RunResult(curve, minutes, per_step)


def table(results: dict[str, dict[int, RunResult]], study: dict[str, Arm], params: list[str], target: float) -> str:
    """The markdown table of the confirmation."""
    seeds = sorted(next(iter(results.values())))
    head = ["arm", "study (seed 0)", *(f"seed {s}" for s in seeds), "mean", "worst", f"episodes to {target:.0%}"]
    lines = ["| " + " | ".join(head + params) + " |", "|" + "---|" * (len(head) + len(params))]
    for name, by_seed in results.items():
        finals = [by_seed[s].final for s in seeds]
        reach = [by_seed[s].episodes_to(target) for s in seeds]
        reached = [r for r in reach if not math.isnan(r)]
        to = f"{sum(reached) / len(reached):.0f} ({len(reached)}/{len(seeds)} seeds)" if reached else "not reached"
        arm = study[name]
        cells = [name, f"{arm.study_value:.1%}", *(f"{v:.1%}" for v in finals), f"{sum(finals) / len(finals):.1%}"]
        cells += [f"{min(finals):.1%}", to, *(_shown(arm.params.get(k)) for k in params)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _shown(value: Scalar | None) -> str:
    if value is None:
        return "default"
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def plot(results: dict[str, dict[int, RunResult]], trials: list[TrialRow], default: float, path: Path) -> None:
    """Left: each trial's held-out pass@1 in the study, with the default's at the study's seed. Right: held-out
    pass@1 against RL episodes in the confirmation, one line per arm and seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (study, ax) = plt.subplots(1, 2, figsize=(12, 4.2))
    for state, marker, color in (("complete", "o", "C0"), ("pruned", "s", "C1")):
        shown = [t for t in trials if t.state == state and t.value is not None]
        label = state if state == "complete" else "pruned (last periodic eval)"
        study.scatter([t.number for t in shown], [t.value for t in shown], marker=marker, color=color, label=label)
    study.axhline(default, color="k", ls="--", label=f"default, same seed ({default:.1%})")
    study.set_xlabel("trial")
    study.set_ylabel("held-out pass@1 after RL (study seed)")
    study.grid(alpha=0.3)
    study.legend(fontsize=8)
    for i, (name, by_seed) in enumerate(results.items()):
        for j, (seed, r) in enumerate(sorted(by_seed.items())):
            xs = [s * r.episodes_per_step for s in sorted(r.curve)]
            ys = [r.curve[s] for s in sorted(r.curve)]
            ax.plot(xs, ys, marker="o", color=f"C{i}", ls=("-", "--", ":")[j % 3], label=f"{name} seed {seed}")
    ax.set_xlabel("RL episodes")
    ax.set_ylabel("held-out pass@1 (confirmation, other seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    """Parse the options, run the arms one at a time, print the table and the RESULT line."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--study", type=Path, required=True)
    ap.add_argument("--top", type=int, default=3)
    ap.add_argument("--seeds", default="1,2")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--target", type=float, default=0.45)
    ap.add_argument("--default-run", type=Path, default=None, help="The base config's run at the study's seed.")
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args()
    out = (a.out or a.study / "confirm").resolve()
    out.mkdir(parents=True, exist_ok=True)
    sweep = open_sweep(a.study)
    chosen = arms(sweep, a.top, a.default_run)
    seeds = [int(s) for s in a.seeds.split(",")]
    results: dict[str, dict[int, RunResult]] = {}
    for seed in seeds:
        for arm in chosen:
            results.setdefault(arm.name, {})[seed] = run_arm(sweep, arm, seed, out, list(a.overrides))
            r = results[arm.name][seed]
            print(f"{arm.name} seed {seed}: held-out pass@1 {r.final:.1%} in {r.minutes:.1f} min", flush=True)
    md = table(results, {x.name: x for x in chosen}, list(sweep.spec.space), a.target)
    (out / "confirm.md").write_text(md + "\n")
    plot(results, rows(load_study(sweep)), chosen[0].study_value, out / "confirm.png")
    print(md)
    mean = {n: sum(r.final for r in s.values()) / len(s) for n, s in results.items()}
    worst = {n: min(r.final for r in s.values()) for n, s in results.items()}
    reach = {n: max(r.episodes_to(a.target) for r in s.values()) for n, s in results.items()}
    fast = min((n for n in reach if not math.isnan(reach[n])), key=lambda n: (reach[n], -mean[n]), default="none")
    best = chosen[1].name if len(chosen) > 1 else "none"
    print(
        f"RESULT study_best={chosen[1].study_value:.3f} study_default={chosen[0].study_value:.3f} "
        f"confirm_best={mean.get(best, math.nan):.3f} confirm_default={mean['default']:.3f} "
        f"fast={fast} stable={max(worst, key=lambda n: worst[n])}"
    )


if __name__ == "__main__":
    main()
