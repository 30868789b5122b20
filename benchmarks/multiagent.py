"""Multi-agent collaborative training: does RL lift a planner + executor team, and how does one agent compare,
at equal warm-start and RL budgets?

    python benchmarks/multiagent.py [--seeds 0,1,2] [--out DIR] [--team key=value]... [key=value ...]

For each seed, two ``harmonyrl train`` runs with the same config and budget — SFT steps and batch (the warm start),
RL steps, episodes per step, learning rate, held-out tasks: ``env.name=relay`` (a planner that sees the question
and has no tools, an executor with the calculator that sees only the planner's message; one shared policy;
docs/multiagent.md) and ``env.name=calculator`` (one agent, the same problems). The arms alternate with the seed
(team, single; then single, team; …): the machine's load drifts. Held-out success is pass@1 sampled at the
evaluation temperature (for the team, the executor's graded answer), with greedy beside it.

Budgets are equal by construction: ``--team KEY=VALUE`` (repeatable) may change the team run's env settings, but a
key that sets a budget (``sft.*``, ``rl.steps``, ``rl.lr``, ``rollout.tasks_per_step``, ``rollout.group_size``,
``model.*``) is refused — an earlier version gave the team a warm start of twice the single agent's steps.

Statistics (:mod:`harmonyrl.telemetry.stats`): each run's gain after − before with its task-clustered SE
(``eval/success_se``); over seeds, each arm's mean gain ± SE, and the team − single difference paired by seed.
Per-role metrics come from the team run's ``metrics.jsonl`` (``eval_team/<role>/…``). A run whose folder under
``--out`` has finished (``summary.json``) is read back, not re-run.
Last line: ``RESULT team_before=… team_after=… team_gain=… team_gain_se=… single_before=… single_after=…
single_gain=… single_gain_se=… team_minus_single=… team_minus_single_se=… team_greedy_after=…
single_greedy_after=… team_minutes=… single_minutes=… seeds=…`` (means over seeds; gains in pass@1, not points).
``--quick``: one seed, a tiny model and budget (a smoke test).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from harmonyrl.config import load_config
from harmonyrl.jobs.train import TrainResult, train
from harmonyrl.telemetry.stats import Estimate, difference, over_seeds, paired

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


BUDGET_KEYS = ("sft.", "rl.steps", "rl.lr", "rollout.tasks_per_step", "rollout.group_size", "model.")
QUICK = ["model.preset=nano", "sft.steps=8", "rl.steps=2", "rollout.tasks_per_step=2", "rollout.group_size=2",
         "eval.n_tasks=4", "eval.samples_per_task=2"]  # fmt: skip


def gain(run_dir: Path, result: TrainResult) -> Estimate:
    """The run's held-out gain after − before, SE from the two evaluations' task-clustered SEs."""
    before, after = held_out_evals(run_dir)
    nan = float("nan")
    b = Estimate(result.success_before, float(before.get("eval/success_se", nan)), 0, 0)
    a = Estimate(result.success_after, float(after.get("eval/success_se", nan)), 0, 0)
    return difference(b, a)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", default="0", help="comma-separated seeds; every arm runs each")
    parser.add_argument("--out", type=Path, default=None, help="keep run folders here (default: temp dir)")
    parser.add_argument("--team", action="append", default=[], metavar="KEY=VALUE", help="a team-only env override")
    parser.add_argument("--quick", action="store_true", help="one seed, tiny model and budget: a smoke test")
    parser.add_argument("overrides", nargs="*", help="config overrides shared by both runs, e.g. rl.steps=40")
    args = parser.parse_args()
    if bad := [t for t in args.team if t.split("=", 1)[0].startswith(BUDGET_KEYS)]:
        parser.error(f"--team {bad[0]}: a team-only budget makes the comparison unfair; set it for both arms")
    overrides = [*QUICK, *args.overrides] if args.quick else args.overrides
    seeds = [0] if args.quick else [int(x) for x in args.seeds.split(",")]
    console = Console()
    out = args.out or Path(tempfile.mkdtemp(prefix="harmonyrl-multiagent-"))
    arms = {"team": ("relay", args.team), "single": ("calculator", [])}
    results: dict[str, dict[int, TrainResult]] = {"team": {}, "single": {}}
    for i, seed in enumerate(seeds):
        for arm in ("team", "single") if i % 2 == 0 else ("single", "team"):
            env, extra = arms[arm]
            name = f"{arm}_s{seed}"
            cfg = load_config(None, [*overrides, *extra, f"seed={seed}", f"env.name={env}", f"output_dir={out}",
                                     f"run_name={name}"])  # fmt: skip
            done = finished(out / name)
            if done is not None:
                console.print(f"{name}: reusing the finished run in {out / name}")
            results[arm][seed] = done or asyncio.run(train(cfg, console))
    table = Table(title=f"held-out pass@1, same budget ({' '.join(overrides) or 'default config'})")
    for col in ("arm", "seed", "before RL", "after RL", "gain (pp) ± SE", "greedy before", "greedy after", "minutes"):
        table.add_column(col, justify="right")
    gains: dict[str, dict[int, Estimate]] = {"team": {}, "single": {}}
    for arm, runs in results.items():
        for seed, r in runs.items():
            g = gains[arm][seed] = gain(r.run_dir, r)
            table.add_row(arm, str(seed), f"{r.success_before:.1%}", f"{r.success_after:.1%}",
                          f"{100 * g.mean:+.1f} ± {100 * g.se:.1f}", f"{r.greedy_before:.1%}", f"{r.greedy_after:.1%}",
                          f"{r.minutes:.1f}")  # fmt: skip
    console.print(table)
    console.print(role_table(results["team"][seeds[0]].run_dir))
    pooled = {arm: over_seeds({s: g.mean for s, g in gains[arm].items()}) for arm in gains}
    # one seed: the SE is the run's own (task-clustered); several: the spread over seeds
    se = {arm: pooled[arm].se if len(seeds) > 1 else gains[arm][seeds[0]].se for arm in gains}
    by_seed = {arm: {str(s): g.mean for s, g in gains[arm].items()} for arm in gains}
    diff = paired(by_seed["single"], by_seed["team"])
    diff_se = diff.se if len(seeds) > 1 else math.hypot(se["team"], se["single"])
    keys = ("success_before", "success_after", "greedy_after", "minutes")
    mean = {arm: {key: statistics.fmean(getattr(r, key) for r in runs.values()) for key in keys}
            for arm, runs in results.items()}  # fmt: skip
    print(
        f"RESULT team_before={mean['team']['success_before']:.3f} team_after={mean['team']['success_after']:.3f} "
        f"team_gain={pooled['team'].mean:.3f} team_gain_se={se['team']:.3f} "
        f"single_before={mean['single']['success_before']:.3f} single_after={mean['single']['success_after']:.3f} "
        f"single_gain={pooled['single'].mean:.3f} single_gain_se={se['single']:.3f} "
        f"team_minus_single={diff.mean:.3f} team_minus_single_se={diff_se:.3f} "
        f"team_greedy_after={mean['team']['greedy_after']:.3f} "
        f"single_greedy_after={mean['single']['greedy_after']:.3f} "
        f"team_minutes={mean['team']['minutes']:.2f} single_minutes={mean['single']['minutes']:.2f} "
        f"seeds={','.join(map(str, seeds))}"
    )


if __name__ == "__main__":
    main()
