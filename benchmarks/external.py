"""Do environments no one here wrote learn? One RL run per row of ``benchmarks/external/``, held-out before → after.

    python benchmarks/external.py [--rows rg_letter_counting,...] [--out DIR] [--deadline HH:MM] [--table-only]

Each row is a run config in ``benchmarks/external/<row>.yaml`` for one of the ecosystem adapters (``env.name=
reasoning_gym`` / ``verifiers`` / ``textarena``, :mod:`harmonyrl.tasks.ecosystems`; the verifiers rows use the example
environments of ``examples/verifiers_envs``, put on ``PYTHONPATH``), run as ``harmonyrl train -c
<row>.yaml threads=1 eval.split=validation`` in a subprocess (SFT warm start on the adapter's reference-answer
expert → validation eval → RL → validation eval), one after the other, then its warm start and final weights evaluated
once on test. The machinery is ``benchmarks/envs.py``'s: finished runs and test evaluations in ``--out`` are reused, a
stopped run resumed, a row whose config changed is refused, a run still going at ``--deadline`` is stopped and reported
as such, never given a made-up figure.

**Splits.** As in ``benchmarks/envs.py``: the run's own evaluations are on each row's validation split (where the
rows' settings are chosen; earlier choices are in docs/reasoning-gym.md and docs/textarena.md), the reported figures
on test, measured once after; the table says whether each row passes on validation.

**Learned** (:func:`harmonyrl.telemetry.stats.learned`): the held-out gain in pass@1 (sampled at T=1) exceeds +10
points and 2 standard errors (the task-clustered ``eval/success_se`` of each evaluation). The table also gives each
row's **constant baseline**: the test success of always answering the split's most common reference answer, so a
policy that learned only to say "1" is read as such. Last line: ``RESULT envs=a,b,… learned=N of M
rule=gain>10pp&>2SE split=test chosen_on=validation passed_validation=K of M`` (M: the selected rows, run or not).
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import envs as bench  # benchmarks/envs.py: the runner, the table and the learned rule
from harmonyrl.config import load_config
from harmonyrl.tasks.factory import make_factory

ROWS_DIR = Path(__file__).resolve().parent / "external"
ROWS = (
    "rg_letter_counting",
    "rg_syllogism",
    "vf_calc",
    "vf_max",
    "ta_tictactoe",
    "ta_kuhnpoker",
    "ta_kuhnpoker_vs_ckpt",  # plays ta_kuhnpoker's final checkpoint: after it
)
"""The rows, in the order they run."""
OPPONENT_ROW = {"ta_kuhnpoker_vs_ckpt": "ta_kuhnpoker"}
"""Rows whose fixed opponent is another row's final checkpoint in the same ``--out`` (``env.opponent=<folder>``, set
here: the row's file names ``random`` so it reads as a config anywhere); that row must have run first."""
EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "verifiers_envs"
"""The example verifiers environments (``vf_calc``), importable by the runs this script starts."""


def constant_baseline(config: Path, split: str) -> float | None:
    """Held-out success of always answering the most common reference answer of the evaluated tasks; None (shown
    as "—") where the tasks have no reference answer (a game is won by play, not by a string)."""
    cfg = load_config(config, [f"eval.split={split}"])
    tasks = list(make_factory(cfg.env, cfg.seed).tasks(cfg.eval.split))[: cfg.eval.n_tasks]
    counts = collections.Counter(t.answer for t in tasks if t.answer)
    return counts.most_common(1)[0][1] / len(tasks) if counts else None


def parse_rows(text: str) -> list[str]:
    """The ``--rows`` list, in the benchmark's order; an unknown name is a one-line error."""
    return bench.parse_names(text, ROWS, "--rows", "row")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", default=",".join(ROWS), help="comma-separated subset of " + ",".join(ROWS))
    parser.add_argument("--out", type=Path, default=Path("runs/external"))
    parser.add_argument("--deadline", default=None, help="HH:MM UTC: stop the run going then, start no other")
    parser.add_argument("--table-only", action="store_true", help="only tabulate the finished runs in --out")
    args = parser.parse_args()
    rows = parse_rows(args.rows)
    out: Path = args.out
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(EXAMPLES), os.environ.get("PYTHONPATH", "")) if p)
    sys.path.insert(0, str(EXAMPLES))
    out.mkdir(parents=True, exist_ok=True)
    status: dict[str, str] = {}
    for row in rows:
        left = bench.seconds_left(args.deadline)
        if args.table_only or (left is not None and left <= 0):
            continue
        if (first := OPPONENT_ROW.get(row)) is None:
            status[row] = bench.run_env(row, ROWS_DIR / f"{row}.yaml", out, left)
        elif not ((checkpoint := out / first / "checkpoints" / "final") / "config.json").is_file():
            status[row] = f"not run (its opponent is {first}'s final checkpoint: run {first} first)"
        else:
            status[row] = bench.run_env(row, ROWS_DIR / f"{row}.yaml", out, left, (f"env.opponent={checkpoint}",))
    results = [bench.read_row(r, ROWS_DIR / f"{r}.yaml", out, status.get(r, "not run (budget)")) for r in rows]
    lines = bench.table(results)
    lines[0] += " constant baseline (test) |"
    lines[1] += "---|"
    for i, row in enumerate(rows):
        lines[2 + i] += f" {bench.fmt(constant_baseline(ROWS_DIR / f'{row}.yaml', 'test'))} |"
    (out / "external.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(bench.result_line(results))


if __name__ == "__main__":
    main()
