"""Multi-agent collaborative training: does RL lift a planner + executor team, and how does one agent compare?

    python benchmarks/multiagent.py [--out DIR] [--team key=value]... [key=value ...]

Two ``harmonyrl train`` runs with the same config and budget (SFT steps, RL steps, episodes per step, held-out
tasks and seed): ``env.name=relay`` (a planner that sees the question and has no tools, an executor with the
calculator that sees only the planner's message; one shared policy; docs/multiagent.md) and ``env.name=calculator``
(one agent, the same problems). Held-out success is pass@1 sampled at the evaluation temperature; for the team
it is the team's (the executor's graded answer). Per-role metrics come from the run's ``metrics.jsonl``
(``eval_team/<role>/…``). ``--team KEY=VALUE`` (repeatable) overrides the team run only (say it beside its
figures); an arm whose run folder under ``--out`` has finished (``summary.json``) is read back, not re-run.
Last line: ``RESULT team_before=… team_after=… single_after=… single_before=… team_minutes=… single_minutes=…``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from harmonyrl.config import load_config
from harmonyrl.trainer.loop import TrainResult, train

ROLES = ("planner", "executor")
SHOWN = ("reward", "response_tokens", "parse_error_rate", "tool_call_rate", "truncated_rate")


def held_out_evals(run_dir: Path) -> tuple[dict[str, float], dict[str, float]]:
    """The run's held-out evaluations before and after RL (the first and the last ``eval`` rows)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = [r for r in rows if r.get("phase") == "eval"]
    return evals[0], evals[-1]


def finished(run_dir: Path) -> TrainResult | None:
    """A run of an earlier invocation with the same ``--out`` that finished (it wrote ``summary.json``): the
    benchmark then resumes arm by arm instead of training it again."""
    summary = run_dir / "summary.json"
    if not summary.is_file():
        return None
    s = json.loads(summary.read_text())
    return TrainResult(run_dir, s["success_before"], s["success_after"], s["greedy_success_before"],
                       s["greedy_success_after"], s["minutes"])  # fmt: skip


def role_table(run_dir: Path) -> Table:
    """Per-role held-out metrics before → after RL."""
    before, after = held_out_evals(run_dir)
    table = Table(title="team, per role (held-out, sampled): before RL → after RL")
    table.add_column("metric")
    for role in ROLES:
        table.add_column(role, justify="right")
    for metric in SHOWN:
        cells = []
        for role in ROLES:
            key = f"eval_team/{role}/{metric}"
            cells.append(f"{float(before.get(key, float('nan'))):.3f} → {float(after.get(key, float('nan'))):.3f}")
        table.add_row(metric, *cells)
    return table


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=None, help="keep run folders here (default: temp dir)")
    parser.add_argument("--team", action="append", default=[], metavar="KEY=VALUE", help="a team-only override")
    parser.add_argument("overrides", nargs="*", help="config overrides shared by both runs, e.g. rl.steps=40")
    args = parser.parse_args()
    console = Console()
    out = args.out or Path(tempfile.mkdtemp(prefix="harmonyrl-multiagent-"))
    results: dict[str, TrainResult] = {}
    for arm, env, extra in (("team", "relay", args.team), ("single", "calculator", [])):
        cfg = load_config(None, [*args.overrides, *extra, f"env.name={env}", f"output_dir={out}", f"run_name={arm}"])
        done = finished(out / arm)
        if done is not None:
            console.print(f"{arm}: reusing the finished run in {out / arm}")
        results[arm] = done or asyncio.run(train(cfg, console))
    table = Table(title=f"held-out pass@1, same budget ({' '.join(args.overrides) or 'default config'})")
    for col in ("arm", "before RL", "after RL", "gain (pp)", "greedy before", "greedy after", "minutes"):
        table.add_column(col, justify="right")
    for arm, r in results.items():
        gain = f"{100 * (r.success_after - r.success_before):+.1f}"
        table.add_row(arm, f"{r.success_before:.1%}", f"{r.success_after:.1%}", gain, f"{r.greedy_before:.1%}",
                      f"{r.greedy_after:.1%}", f"{r.minutes:.1f}")  # fmt: skip
    console.print(table)
    console.print(role_table(results["team"].run_dir))
    team, single = results["team"], results["single"]
    print(
        f"RESULT team_before={team.success_before:.3f} team_after={team.success_after:.3f} "
        f"single_after={single.success_after:.3f} single_before={single.success_before:.3f} "
        f"team_minutes={team.minutes:.2f} single_minutes={single.minutes:.2f}"
    )


if __name__ == "__main__":
    main()
