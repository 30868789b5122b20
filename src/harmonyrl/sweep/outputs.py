"""What a sweep leaves behind: ``trials.csv``, ``trials.png``, ``best_config.yaml`` and the console table.

The table and the best config are rewritten after every trial, so a sweep that is stopped has its results so far
on disk; the plot (a second of matplotlib) when the sweep ends or stops.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from harmonyrl.config import dump_config
from harmonyrl.sweep.space import Scalar, override

if TYPE_CHECKING:
    import optuna

    from harmonyrl.sweep.study import Sweep

OBJECTIVE = "held-out pass@1 after RL"
STATES = {"COMPLETE": "complete", "PRUNED": "pruned", "FAIL": "failed", "RUNNING": "running"}
"""Optuna's trial states as the outputs name them."""


@dataclass(frozen=True)
class TrialRow:
    """One trial as the outputs show it."""

    number: int
    state: str
    """complete, pruned, failed or running (Optuna's state, lower case)."""
    value: float | None
    """The objective; for a pruned trial its last periodic held-out pass@1."""
    minutes: float | None
    params: dict[str, Scalar]
    error: str
    run_dir: str


def rows(study: optuna.Study) -> list[TrialRow]:
    """The study's trials, in order (queued ones, not yet started, left out)."""
    from optuna.trial import TrialState

    out = []
    for t in study.get_trials(deepcopy=False):
        if t.state == TrialState.WAITING:
            continue
        minutes = t.user_attrs.get("minutes")
        out.append(
            TrialRow(
                t.number,
                STATES.get(t.state.name, t.state.name.lower()),
                t.value if t.values else None,
                None if minutes is None else float(minutes),
                dict(t.params),
                str(t.user_attrs.get("error", "")),
                str(t.user_attrs.get("run_dir", "")),
            )
        )
    return out


def best(trials: Sequence[TrialRow]) -> TrialRow | None:
    """The complete trial with the highest objective (the earliest among equals), or None."""
    done = [r for r in trials if r.state == "complete" and r.value is not None]
    return max(done, key=lambda r: (r.value, -r.number)) if done else None


def write_csv(trials: Sequence[TrialRow], keys: Sequence[str], path: Path) -> None:
    """``trials.csv``: trial, state, value, minutes, one column per searched key, error, run_dir."""
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["trial", "state", "value", "minutes", *keys, "error", "run_dir"])
        for r in trials:
            value = "" if r.value is None else f"{r.value:.6g}"
            minutes = "" if r.minutes is None else f"{r.minutes:.2f}"
            w.writerow([r.number, r.state, value, minutes, *(r.params.get(k, "") for k in keys), r.error, r.run_dir])


def write_plot(trials: Sequence[TrialRow], path: Path) -> None:
    """``trials.png``: each trial's objective (complete and pruned, failed ones marked at the bottom) and the
    best so far among complete trials."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    shown = (("complete", "o", "tab:blue", "complete"), ("pruned", "s", "tab:orange", "pruned (last periodic eval)"))
    for state, marker, colour, label in shown:
        pts = [(r.number, r.value) for r in trials if r.state == state and r.value is not None]
        if pts:
            ax.scatter(*zip(*pts, strict=True), marker=marker, color=colour, label=label, zorder=3)
    failed = [r.number for r in trials if r.state == "failed"]
    if failed:
        ax.scatter(failed, [0.0] * len(failed), marker="x", color="tab:red", label="failed", zorder=3)
    xs, ys, top = [], [], -math.inf
    for r in trials:
        if r.state == "complete" and r.value is not None:
            top = max(top, r.value)
        if top > -math.inf:
            xs.append(r.number)
            ys.append(top)
    if xs:
        ax.step(xs, ys, where="post", color="black", label="best so far")
    ax.set_xlabel("trial")
    ax.set_ylabel(OBJECTIVE)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_best_config(sweep: Sweep, winner: TrialRow, total: int, path: Path) -> None:
    """``best_config.yaml``: the base config with the best trial's values, which ``harmonyrl train -c`` runs (its
    own run name and threads, as the base config had them; without the ``eval.every`` the sweep added to prune)."""
    cfg = sweep.config([override(k, v) for k, v in winner.params.items()], trial=False)
    header = (
        f"# harmonyrl sweep {sweep.folder}: best of {total} trials, trial {winner.number}, "
        f"{OBJECTIVE} {winner.value:.4g}\n# run it: harmonyrl train -c {path}\n"
    )
    path.write_text(header + dump_config(cfg), encoding="utf-8")


def write_outputs(sweep: Sweep, study: optuna.Study, plot: bool = True) -> TrialRow | None:
    """The files from the study as it stands (the plot, the slow one, when ``plot``); returns the best trial (None
    before any trial completed)."""
    trials = rows(study)
    keys = list(sweep.spec.space)
    write_csv(trials, keys, sweep.folder / "trials.csv")
    if plot:
        write_plot(trials, sweep.folder / "trials.png")
    winner = best(trials)
    if winner is not None:
        write_best_config(sweep, winner, len(trials), sweep.folder / "best_config.yaml")
    return winner


def _cells(r: TrialRow, keys: Sequence[str]) -> list[str]:
    value = "" if r.value is None else f"{r.value:.1%}"  # as the summary line and the trial lines show it
    minutes = "" if r.minutes is None else f"{r.minutes:.1f}"
    return [str(r.number), r.state, value, minutes, *(_short(r.params.get(k)) for k in keys)]


def _short(v: Scalar) -> str:
    return f"{v:.3g}" if isinstance(v, float) else ("" if v is None else str(v))


def print_table(console: Console, trials: Sequence[TrialRow], keys: Sequence[str]) -> None:
    """The trials as a table on a terminal, as plain lines elsewhere; the best marked with ``*``."""
    winner = best(trials)
    head = ["trial", "state", OBJECTIVE, "min", *keys]
    if not console.is_terminal:
        console.print(" | ".join(head), highlight=False, soft_wrap=True)
        for r in trials:
            mark = " *" if r is winner else ""
            note = f"  ({r.error})" if r.error else ""
            console.print(" | ".join(_cells(r, keys)) + mark + note, highlight=False, soft_wrap=True)
        return
    table = Table(title=f"trials (objective: {OBJECTIVE}, maximised; * best)")
    for col in head:
        table.add_column(escape(col), justify="right")
    for r in trials:
        cells = [escape(c) for c in _cells(r, keys)]
        cells[0] += " *" if r is winner else ""
        table.add_row(*cells, style="bold" if r is winner else ("red" if r.state == "failed" else None))
    console.print(table)
    for r in trials:
        if r.error:
            console.print(f"trial {r.number}: {escape(r.error)}", highlight=False, soft_wrap=True)
