"""Does every built-in environment learn? One RL run per env from its preset, test-split success before → after.

    python benchmarks/envs.py [--envs maze,sql] [--split test|validation] [--out DIR] [--deadline HH:MM]
                              [--table-only] [--quick]

Each env runs ``harmonyrl train -c src/harmonyrl/presets/<env>.yaml threads=1`` in a subprocess (SFT warm start
on the env's scripted expert → held-out eval → RL → held-out eval), one after the other, cheapest first.

**Splits.** ``--split`` (``eval.split`` of every run; default ``test``) picks the held-out split the runs evaluate
on. Presets (every "chosen setting") are decided on the validation split (``EnvFactory.tasks("validation")``, issue 41
item 1: ``--split validation`` while choosing) and the test figure is measured once after the choice (``--split
test``, the documented figure). The table says whether each env has a validation split (an env without one had its
preset chosen on the same test tasks it is scored on: read such a row as optimistic). The two splits' runs live in
different ``--out`` folders (default ``runs/envs`` and ``runs/envs-validation``).

**Learned** (:func:`harmonyrl.telemetry.stats.learned`): the test gain in pass@1 (sampled at T=1) exceeds +10
points **and** 2 standard errors. The SE of each evaluation is clustered by task (``eval/success_se``: a task's
samples are not independent); the gain's SE combines the two as independent (conservative: the same tasks are
scored before and after). A run that predates ``eval/success_se`` gets the largest SE its task count allows
(``sqrt(p (1 − p) / (tasks − 1))``, every task's samples alike), marked ``≤``. Greedy success is reported beside
pass@1, with its own gain and SE: a sampled gain with greedy falling says RL made the policy more reliable, not more
capable.

Finished runs in ``--out`` are reused and a stopped one is resumed (``--resume``), so an interrupted benchmark
continues where it stopped; a run whose preset now sets other values is refused (delete its folder). With
``--deadline`` (UTC), a run still going then is stopped (kept for resuming) and envs not started are reported as
"not run (budget)" — never a made-up figure. Writes ``envs.md`` (the table) and ``envs.png`` (before → after per
env) into ``--out``. Last line: ``RESULT envs=a,b,… learned=N of M rule=gain>10pp&>2SE split=test|validation
validation=K/M`` (M: the selected envs, run or not; K: how many have a validation split). ``--quick``: the
calculator alone with a tiny model and budget, in its own folder (a smoke test, a minute or two).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import harmonyrl
from harmonyrl.config import RunConfig, load_config
from harmonyrl.tasks.factory import make_factory
from harmonyrl.telemetry.stats import Estimate, difference, learned

ENVS = ("calculator", "retool", "sql", "instruct", "maze", "browse", "humaneval")
"""Every built-in env, in the order they run (cheapest first, as measured by a probe on 2026-11-25)."""
PRESETS = Path(harmonyrl.__file__).parent / "presets"
QUICK = ("model.preset=nano", "sft.steps=8", "rl.steps=2", "rollout.tasks_per_step=2", "rollout.group_size=2",
         "eval.n_tasks=4", "eval.samples_per_task=2")  # fmt: skip
"""Overrides of ``--quick``: a smoke test of the script, not a measurement."""


@dataclass(frozen=True)
class EnvRow:
    """One env's line of the table: its budget, and its measured figures if its run finished."""

    env: str
    budget: str
    status: str
    """``done``, or why there are no figures (``not run (budget)``, ``stopped at the deadline``, ``failed …``)."""
    before: float | None = None
    after: float | None = None
    greedy_before: float | None = None
    greedy_after: float | None = None
    minutes: float | None = None
    load: str = ""
    tool_calls: tuple[float, float] | None = None
    """Held-out tool-call rate (sampled) before and after RL: a policy that learns to answer without its tools shows
    here first (sql's did)."""
    se: tuple[float, float, float, float] | None = None
    """Task-clustered SEs: pass@1 before, after, greedy before, after (``eval[_greedy]/success_se``)."""
    se_bound: bool = False
    """The SEs are the largest the task count allows (a run that predates ``eval/success_se``)."""
    validation: bool = False
    """The env has a validation split (presets chosen on it, this figure on test)."""

    def gain(self, greedy: bool = False) -> Estimate | None:
        """After − before (pass@1, or greedy) with its standard error; None without both figures."""
        pair = (self.greedy_before, self.greedy_after) if greedy else (self.before, self.after)
        if pair[0] is None or pair[1] is None or self.se is None:
            return None
        se_b, se_a = self.se[2:] if greedy else self.se[:2]
        return difference(Estimate(pair[0], se_b, 0, 0), Estimate(pair[1], se_a, 0, 0))

    @property
    def learned(self) -> bool:
        """The test gain in pass@1 exceeds +10 points and 2 standard errors (:func:`stats.learned`)."""
        gain = self.gain()
        return gain is not None and learned(gain)


def budget_of(cfg: RunConfig) -> str:
    """The compute a preset spends, in one cell: model, SFT steps × batch, RL steps × episodes, eval, lengths."""
    r = cfg.rollout
    return (
        f"{cfg.model.preset}; SFT {cfg.sft.steps}×{cfg.sft.batch_size}; RL {cfg.rl.steps}×{r.tasks_per_step}×"
        f"{r.group_size}; eval {cfg.eval.n_tasks}×{cfg.eval.samples_per_task}; seq {r.max_seq_len}, "
        f"turns {r.max_turns}, new {r.max_new_tokens}"
    )


def ran_another_preset(env: str, preset: Path, out: Path) -> bool:
    """Whether the run in ``out/env`` was started from a preset (its copy beside the run) that resolves to another
    config than ``preset`` does now; a changed comment is not another config."""
    copy = out / f"{env}.preset.yaml"
    return (out / env).exists() and copy.is_file() and load_config(copy, []) != load_config(preset, [])


def read_row(env: str, preset: Path, out: Path, status_if_missing: str, overrides: tuple[str, ...] = ()) -> EnvRow:
    """The row of ``env`` from its run folder ``out/env`` (``summary.json``); without one, ``status_if_missing``,
    or where the run stopped if an earlier invocation started it (it was not run *this* time). A run of an older
    preset has no figures here: they would stand beside the new preset's budget."""
    cfg = load_config(preset, list(overrides))
    budget, valid = budget_of(cfg), has_validation(cfg)
    run = out / env
    if ran_another_preset(env, preset, out):
        return EnvRow(env, budget, f"ran an older preset (delete {run} to run this one)", validation=valid)
    summary = run / "summary.json"
    if not summary.is_file():
        started = status_if_missing == "not run (budget)" and (run / "metrics.jsonl").is_file()
        return EnvRow(env, budget, where_stopped(run) if started else status_if_missing, validation=valid)
    s = json.loads(summary.read_text())
    side = out / f"{env}.bench.json"
    load = json.loads(side.read_text()).get("load", "") if side.is_file() else ""
    figures = (s["success_before"], s["success_after"], s["greedy_success_before"], s["greedy_success_after"])
    se, bound = standard_errors(run / "metrics.jsonl", figures, cfg.eval.n_tasks)
    return EnvRow(env, budget, "done", *figures, s["minutes"], load,
                  tool_call_rates(run / "metrics.jsonl") if has_tools(cfg) else None, se, bound, valid)  # fmt: skip


def standard_errors(
    metrics: Path, figures: tuple[float, float, float, float], tasks: int
) -> tuple[tuple[float, float, float, float], bool]:
    """The SEs of pass@1 before, after and greedy before, after from the first and last evaluation in
    ``metrics`` (``eval/success_se``, ``eval_greedy/success_se``), and False; for a run without them, the largest
    SE ``tasks`` tasks allow for each figure (``sqrt(p (1 − p) / (tasks − 1))``), and True."""
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()] if metrics.is_file() else []
    evals = [r for r in rows if r.get("phase") == "eval"]
    keys = ("eval/success_se", "eval_greedy/success_se")
    if len(evals) >= 2 and all(k in evals[0] and k in evals[-1] for k in keys):
        first, last = evals[0], evals[-1]
        return (first[keys[0]], last[keys[0]], first[keys[1]], last[keys[1]]), False
    bound = tuple(math.sqrt(p * (1 - p) / max(tasks - 1, 1)) for p in figures)
    return bound, True  # type: ignore[return-value]


def has_validation(cfg: RunConfig) -> bool:
    """Whether the env has a validation split yet (issue 41 item 1): non-empty and sharing no task with the test
    split (a factory that predates it may answer any split other than "train" with its test tasks)."""
    factory = make_factory(cfg.env, cfg.seed)
    try:
        validation = {t.id for t in factory.tasks("validation")}  # type: ignore[arg-type]
    except (ValueError, KeyError, TypeError, NotImplementedError):
        return False
    return bool(validation) and not validation & {t.id for t in factory.tasks("test")}


def has_tools(cfg: RunConfig) -> bool:
    """Whether the env gives the model any tool (instruct does not: its tool-call rate is no signal)."""
    factory = make_factory(cfg.env, cfg.seed)
    return bool(factory.make(factory.tasks("test")[0]).tools)


def tool_call_rates(metrics: Path) -> tuple[float, float] | None:
    """``eval/tool_call_rate`` of the first and last held-out evaluation in ``metrics`` (before and after RL), or
    None without two evaluations that report it."""
    if not metrics.is_file():
        return None
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    rates = [r["eval/tool_call_rate"] for r in rows if r.get("phase") == "eval" and "eval/tool_call_rate" in r]
    return (rates[0], rates[-1]) if len(rates) >= 2 else None


def where_stopped(run: Path) -> str:
    """``stopped (budget) at <phase> step N of M``, from the last row of an unfinished run's metrics."""
    lines = [line for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    if not lines:
        return "stopped (budget) before its first step"
    last = json.loads(lines[-1])
    cfg = load_config(run / "config.yaml", [f"output_dir={run.parent}", f"run_name={run.name}"])
    total = {"sft": cfg.sft.steps, "rl": cfg.rl.steps}.get(last["phase"])
    step = last["step"] + 1 if last["phase"] == "sft" else last["step"]  # SFT rows count from 0, RL from 1
    return f"stopped (budget) at {last['phase'].upper()} step {step}" + (f" of {total}" if total else "")


def _load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def run_env(env: str, preset: Path, out: Path, timeout_s: float | None, overrides: tuple[str, ...] = ()) -> str:
    """Run (or resume) ``env``'s training in a subprocess: ``done``, ``stopped at the deadline`` or ``failed …``.

    The preset is copied beside the run folder when it starts; a finished or stopped run is reused only if its
    preset still resolves to the same config (a changed value would put another config's figures in the table; a
    changed comment does not). The copy is refreshed then, so the folder shows the preset's current text."""
    run, copy, log = out / env, out / f"{env}.preset.yaml", out / f"{env}.log"
    text = preset.read_text()
    if ran_another_preset(env, preset, out):
        sys.exit(f"error: {preset} changed since the run in {run}: delete that folder to run it again")
    if run.exists() and copy.is_file():
        copy.write_text(text)  # at most a comment changed: the folder shows the preset's current text
    if (run / "summary.json").is_file():
        print(f"{env}: reusing the finished run {run}", flush=True)
        return "done"
    if run.exists() and (run / "config.yaml").is_file():
        cmd = ["harmonyrl", "train", "--resume", str(run)]
    else:
        copy.write_text(text)
        cmd = ["harmonyrl", "train", "-c", str(preset), "threads=1", *overrides, f"output_dir={out}",
               f"run_name={env}"]  # fmt: skip
    print(f"{env}: {' '.join(cmd)}  (log: {log}, load {_load()})", flush=True)
    start = _load()
    with log.open("a") as f:
        try:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout_s, check=False).returncode
        except subprocess.TimeoutExpired:
            return "stopped at the deadline"
    (out / f"{env}.bench.json").write_text(json.dumps({"load": f"{start} → {_load()}"}))
    return "done" if rc == 0 and (run / "summary.json").is_file() else f"failed (exit {rc}, see {log.name})"


def fmt(x: float | None) -> str:
    return "—" if x is None else f"{x:.1%}"


def fmt_gain(gain: Estimate | None, bound: bool) -> str:
    """``+25.0 ± 4.1`` points (``± ≤4.1`` for an SE bound)."""
    return "—" if gain is None else f"{100 * gain.mean:+.1f} ± {'≤' if bound else ''}{100 * gain.se:.1f}"


def table(rows: list[EnvRow]) -> list[str]:
    """The markdown table: one row per env; an env without figures says why in the result column."""
    lines = ["| env | test pass@1 before → after | gain ± SE (pp) | greedy before → after | greedy gain ± SE (pp) | "
             "learned (> +10 pp and > 2 SE) | validation split | minutes | load avg 1/5/15 min, start → end | "
             "tool calls before → after | budget |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        valid = "yes" if r.validation else "not yet"
        if r.before is None or r.after is None:
            lines.append(f"| {r.env} | {r.status} | — | — | — | no | {valid} | — | — | — | {r.budget} |")
            continue
        greedy = f"{fmt(r.greedy_before)} → {fmt(r.greedy_after)}"
        tools = "—" if r.tool_calls is None else f"{fmt(r.tool_calls[0])} → {fmt(r.tool_calls[1])}"
        learned_cell = "**yes**" if r.learned else "no"
        lines.append(f"| {r.env} | {fmt(r.before)} → {fmt(r.after)} | {fmt_gain(r.gain(), r.se_bound)} | {greedy} | "
                     f"{fmt_gain(r.gain(greedy=True), r.se_bound)} | {learned_cell} | {valid} | {r.minutes:.1f} | "
                     f"{r.load} | {tools} | {r.budget} |")  # fmt: skip
    return lines


def result_line(rows: list[EnvRow], split: str = "test") -> str:
    """``RESULT envs=a,b,… learned=N of M rule=… split=… validation=K/M``: M counts every selected env, run or
    not; K those with a validation split."""
    return (f"RESULT envs={','.join(r.env for r in rows)} learned={sum(r.learned for r in rows)} of {len(rows)} "
            f"rule=gain>10pp&>2SE split={split} validation={sum(r.validation for r in rows)}/{len(rows)}")  # fmt: skip


def plot(rows: list[EnvRow], path: Path) -> None:
    """Bars of held-out pass@1 before and after RL per env (envs without figures are labelled, not drawn)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1.3 * len(rows) + 2, 3.6))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r.before or 0.0 for r in rows], 0.4, label="warm start (SFT)", color="#999")
    ax.bar([x + 0.2 for x in xs], [r.after or 0.0 for r in rows], 0.4, label="after RL", color="#1f77b4")
    for x, r in zip(xs, rows, strict=True):
        if r.before is None:
            ax.text(x, 0.01, "no figure", ha="center", fontsize=8, rotation=90)
    ax.set_xticks(list(xs), [r.env for r in rows])
    ax.set_ylabel("held-out pass@1")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def parse_names(text: str, known: Sequence[str], flag: str, noun: str) -> list[str]:
    """A comma-separated ``flag`` list of ``known`` names, in ``known``'s order; an unknown name is a one-line error
    (``--envs`` here, ``--rows`` in external.py)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        sys.exit(f"error: {flag}: unknown {noun} {', '.join(unknown) or '(none given)'}; choose from {','.join(known)}")
    return [e for e in known if e in names]


def parse_envs(text: str) -> list[str]:
    """The ``--envs`` list, in the benchmark's order; an unknown name is a one-line error."""
    return parse_names(text, ENVS, "--envs", "env")


def seconds_left(deadline: str | None) -> float | None:
    """Seconds until ``deadline`` (``HH:MM`` UTC, the nearest such time: at most 12 h past, else the next day's),
    or None without one."""
    if deadline is None:
        return None
    now = dt.datetime.now(dt.UTC)
    hh, mm = (int(x) for x in deadline.split(":"))
    end = now.replace(hour=hh, minute=mm, second=0, microsecond=0)
    if (now - end).total_seconds() > 12 * 3600:  # 00:30 asked at 23:00 means tomorrow's
        end += dt.timedelta(days=1)
    return (end - now).total_seconds()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--envs", default=",".join(ENVS), help="comma-separated subset, e.g. maze,sql")
    parser.add_argument("--out", type=Path, default=Path("runs/envs"))
    parser.add_argument("--presets", type=Path, default=PRESETS, help="folder of <env>.yaml presets")
    parser.add_argument("--deadline", default=None, help="HH:MM UTC: stop the run going then, start no other")
    parser.add_argument("--table-only", action="store_true", help="only tabulate the finished runs in --out")
    parser.add_argument("--quick", action="store_true", help="calculator only, tiny model and budget: a smoke test")
    parser.add_argument("--split", choices=("test", "validation"), default="test", help="held-out split: eval.split")
    args = parser.parse_args()
    overrides: tuple[str, ...] = (f"eval.split={args.split}",)
    if args.split == "validation" and args.out == Path("runs/envs"):
        args.out = Path("runs/envs-validation")  # a test-split run must not be reused for validation
    if args.quick:
        args.envs, overrides = "calculator", (*QUICK, *overrides)
        args.out = args.out if args.out != Path("runs/envs") else Path(tempfile.mkdtemp(prefix="harmonyrl-envs-"))
    envs = parse_envs(args.envs)
    args.out.mkdir(parents=True, exist_ok=True)
    status: dict[str, str] = {}
    for env in envs:
        left = seconds_left(args.deadline)
        if args.table_only or (left is not None and left <= 0):
            continue
        status[env] = run_env(env, args.presets / f"{env}.yaml", args.out, left, overrides)
    rows = [read_row(e, args.presets / f"{e}.yaml", args.out, status.get(e, "not run (budget)"), overrides)
            for e in envs]  # fmt: skip
    lines = table(rows)
    (args.out / "envs.md").write_text("\n".join(lines) + "\n")
    plot(rows, args.out / "envs.png")
    print("\n".join(lines))
    print(f"table: {args.out / 'envs.md'}  plot: {args.out / 'envs.png'}  load average now {_load()}")
    print(result_line(rows, args.split))


if __name__ == "__main__":
    main()
