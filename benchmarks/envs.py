"""Does every built-in environment learn? One RL run per env from its preset: chosen on validation, scored on test.

    python benchmarks/envs.py [--envs maze,sql] [--out DIR] [--deadline HH:MM] [--table-only] [--quick]

Each env runs ``harmonyrl train -c src/harmonyrl/presets/<env>.yaml threads=1 eval.split=validation`` in a
subprocess (SFT warm start on the env's scripted expert → evaluation → RL → evaluation), one after the other.

**Splits (issue 41 item 1).** The run's own evaluations are on the **validation** split: that is where a preset is
chosen, and the table says whether each preset passes there (the same rule as below). Then the warm start
(``checkpoints/sft``) and the final weights (``checkpoints/final``) are each evaluated **once on the test split**
(``harmonyrl eval --split test --metrics-out <env>.test-<sft|final>.json``, the run's own eval settings), and those
are the figures to report. The training never sees either split (no early stopping, no checkpoint picking), so one
run serves both: its test figure is what a second run choosing nothing would have measured. A standalone
``harmonyrl eval`` of a checkpoint reproduces the run's in-run evaluation of it on the same split (checked on a
calculator run, docs/envs.md), so the two splits' figures are measured alike.

**Learned** (:func:`harmonyrl.telemetry.stats.learned`): the test gain in pass@1 (sampled at T=1) exceeds +10 points
**and** 2 standard errors. The SE of each evaluation is clustered by task (``eval/success_se``: a task's samples are
not independent); the gain's SE combines the two as independent (conservative: the same tasks are scored before and
after). Greedy success is reported beside pass@1, with its own gain and SE: a sampled gain with greedy falling says RL
made the policy more reliable, not more capable.

Finished runs and test evaluations in ``--out`` are reused and a stopped run is resumed (``--resume``), so an
interrupted benchmark continues where it stopped; a run whose preset now sets other values is refused (delete its
folder), as is one whose evaluations were not on validation. With ``--deadline`` (UTC), a run still going then is
stopped (kept for resuming) and envs not started are reported as "not run (budget)" — never a made-up figure. Writes
``envs.md`` (the table) and ``envs.png`` (test before → after per env) into ``--out``. Last line: ``RESULT
envs=a,b,… learned=N of M rule=gain>10pp&>2SE split=test chosen_on=validation passed_validation=K of M`` (M: the
selected envs, run or not). ``--quick``: the calculator alone with a tiny model and budget, in its own folder (a smoke
test, a minute or two).
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
import time
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
class Eval:
    """One split's evaluation of the warm start and of the final weights: pass@1 and greedy, each with its SE."""

    before: float
    after: float
    greedy_before: float
    greedy_after: float
    se: tuple[float, float, float, float]
    """Task-clustered SEs: pass@1 before, after, greedy before, after (``eval[_greedy]/success_se``)."""
    se_bound: bool = False
    """The SEs are the largest the task count allows (a run that predates ``eval/success_se``)."""

    def gain(self, greedy: bool = False) -> Estimate:
        """After − before (pass@1, or greedy) with its standard error."""
        pair = (self.greedy_before, self.greedy_after) if greedy else (self.before, self.after)
        se_b, se_a = self.se[2:] if greedy else self.se[:2]
        return difference(Estimate(pair[0], se_b, 0, 0), Estimate(pair[1], se_a, 0, 0))

    @property
    def learned(self) -> bool:
        """The gain in pass@1 exceeds +10 points and 2 standard errors (:func:`stats.learned`)."""
        return learned(self.gain())


@dataclass(frozen=True)
class EnvRow:
    """One env's line of the table: its budget, and its measured figures on each split if its run finished."""

    env: str
    budget: str
    status: str
    """``done``, or why there are no (test) figures (``not run (budget)``, ``stopped at the deadline``, …)."""
    validation: Eval | None = None
    """The run's own evaluations (``eval.split=validation``): where the preset is chosen."""
    test: Eval | None = None
    """The warm start and final weights evaluated once on the test split: the figures reported."""
    minutes: float | None = None
    load: str = ""
    tool_calls: tuple[float, float] | None = None
    """Test tool-call rate (sampled) before and after RL: a policy that learns to answer without its tools shows
    here first (sql's did)."""

    @property
    def learned(self) -> bool:
        """The test gain in pass@1 exceeds +10 points and 2 standard errors."""
        return self.test is not None and self.test.learned

    @property
    def passed_validation(self) -> bool:
        """The preset learns on validation by the same rule: a setting one would choose."""
        return self.validation is not None and self.validation.learned


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
    """The row of ``env`` from its run folder ``out/env`` (``summary.json``, ``metrics.jsonl``: validation) and its
    test evaluations (``out/<env>.test-sft.json``, ``-final.json``); without a finished run, ``status_if_missing``,
    or where the run stopped if an earlier invocation started it (it was not run *this* time). A run of an older
    preset has no figures here: they would stand beside the new preset's budget."""
    cfg = load_config(preset, list(overrides))
    budget, run = budget_of(cfg), out / env
    if ran_another_preset(env, preset, out):
        return EnvRow(env, budget, f"ran an older preset (delete {run} to run this one)")
    summary = run / "summary.json"
    if not summary.is_file():
        started = status_if_missing == "not run (budget)" and (run / "metrics.jsonl").is_file()
        return EnvRow(env, budget, where_stopped(run) if started else status_if_missing)
    s = json.loads(summary.read_text())
    side = out / f"{env}.bench.json"
    load = json.loads(side.read_text()).get("load", "") if side.is_file() else ""
    figures = (s["success_before"], s["success_after"], s["greedy_success_before"], s["greedy_success_after"])
    se, bound = standard_errors(run / "metrics.jsonl", figures, cfg.eval.n_tasks)
    validation = Eval(*figures, se, bound)
    test = read_test_eval(out, env)
    status = "done" if test is not None else "trained; not yet evaluated on test"
    rates = tool_call_rates_on_test(out, env) if test is not None and has_tools(cfg) else None
    return EnvRow(env, budget, status, validation, test, s["minutes"], load, rates)


def test_records(out: Path, env: str) -> tuple[Path, Path]:
    """Where the test evaluations of the warm start and of the final weights are written."""
    return out / f"{env}.test-sft.json", out / f"{env}.test-final.json"


def read_test_eval(out: Path, env: str) -> Eval | None:
    """The test split's :class:`Eval` from the two ``harmonyrl eval --metrics-out`` files, or None without both."""
    files = test_records(out, env)
    if not all(f.is_file() for f in files):
        return None
    before, after = (json.loads(f.read_text())["metrics"] for f in files)
    keys = ("eval/success", "eval_greedy/success")
    se_keys = ("eval/success_se", "eval_greedy/success_se")
    return Eval(before[keys[0]], after[keys[0]], before[keys[1]], after[keys[1]],
                (before[se_keys[0]], after[se_keys[0]], before[se_keys[1]], after[se_keys[1]]))  # fmt: skip


def tool_call_rates_on_test(out: Path, env: str) -> tuple[float, float] | None:
    """``eval/tool_call_rate`` on test before and after RL, or None if either evaluation lacks it."""
    rates = [json.loads(f.read_text())["metrics"].get("eval/tool_call_rate") for f in test_records(out, env)]
    return (rates[0], rates[1]) if rates[0] is not None and rates[1] is not None else None


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


def has_tools(cfg: RunConfig) -> bool:
    """Whether the env gives the model any tool (instruct does not: its tool-call rate is no signal)."""
    factory = make_factory(cfg.env, cfg.seed)
    return bool(factory.make(factory.tasks("test")[0]).tools)


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
    """Run (or resume) ``env``'s training in a subprocess, then evaluate its warm start and final weights on test:
    ``done``, ``stopped at the deadline`` or ``failed …``.

    The preset is copied beside the run folder when it starts; a finished or stopped run is reused only if its
    preset still resolves to the same config (a changed value would put another config's figures in the table; a
    changed comment does not) and its evaluations were on validation. The copy is refreshed then, so the folder
    shows the preset's current text."""
    run, copy, log = out / env, out / f"{env}.preset.yaml", out / f"{env}.log"
    text = preset.read_text()
    if ran_another_preset(env, preset, out):
        sys.exit(f"error: {preset} changed since the run in {run}: delete that folder to run it again")
    if (run / "config.yaml").is_file() and load_config(run / "config.yaml", []).eval.split != "validation":
        sys.exit(f"error: the run in {run} evaluated on test, not validation: delete that folder to run it again")
    if run.exists() and copy.is_file():
        copy.write_text(text)  # at most a comment changed: the folder shows the preset's current text
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    if (run / "summary.json").is_file():
        print(f"{env}: reusing the finished run {run}", flush=True)
    else:
        if run.exists() and (run / "config.yaml").is_file():
            cmd = ["harmonyrl", "train", "--resume", str(run)]
        else:
            copy.write_text(text)
            cmd = ["harmonyrl", "train", "-c", str(preset), "threads=1", "eval.split=validation", *overrides,
                   f"output_dir={out}", f"run_name={env}"]  # fmt: skip
        start = _load()
        status = run_logged(cmd, log, deadline)
        (out / f"{env}.bench.json").write_text(json.dumps({"load": f"{start} → {_load()}"}))
        if status != "done" or not (run / "summary.json").is_file():
            return status if status != "done" else f"failed (no summary.json, see {log.name})"
    for checkpoint, record in zip(("sft", "final"), test_records(out, env), strict=True):
        if record.is_file():
            continue
        cmd = ["harmonyrl", "eval", "--checkpoint", str(run / "checkpoints" / checkpoint), "-c",
               str(run / "config.yaml"), "--split", "test", "--metrics-out", str(record), "threads=1"]  # fmt: skip
        status = run_logged(cmd, log, deadline)
        if status != "done":
            return status
    return "done"


def run_logged(cmd: list[str], log: Path, deadline: float | None) -> str:
    """Run ``cmd`` with its output appended to ``log``, stopped at ``deadline`` (``time.monotonic()``): ``done``,
    ``stopped at the deadline`` or ``failed (exit N, see LOG)``."""
    print(f"{' '.join(cmd)}  (log: {log}, load {_load()})", flush=True)
    timeout = None if deadline is None else max(deadline - time.monotonic(), 0.0)
    with log.open("a") as f:
        try:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout, check=False).returncode
        except subprocess.TimeoutExpired:
            return "stopped at the deadline"
    return "done" if rc == 0 else f"failed (exit {rc}, see {log.name})"


def fmt(x: float | None) -> str:
    return "—" if x is None else f"{x:.1%}"


def fmt_gain(gain: Estimate | None, bound: bool) -> str:
    """``+25.0 ± 4.1`` points (``± ≤4.1`` for an SE bound)."""
    return "—" if gain is None else f"{100 * gain.mean:+.1f} ± {'≤' if bound else ''}{100 * gain.se:.1f}"


def table(rows: list[EnvRow]) -> list[str]:
    """The markdown table: one row per env; an env without test figures says why in the test column."""
    lines = ["| env | validation pass@1 before → after | validation gain ± SE (pp) | preset passes validation | "
             "test pass@1 before → after | test gain ± SE (pp) | test greedy before → after | greedy gain ± SE (pp) | "
             "learned on test (> +10 pp and > 2 SE) | minutes (training) | load avg 1/5/15 min, start → end | "
             "test tool calls before → after | budget |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        v = r.validation
        val = ["—", "—", "—"] if v is None else [f"{fmt(v.before)} → {fmt(v.after)}", fmt_gain(v.gain(), v.se_bound),
                                                 "yes" if r.passed_validation else "**no**"]  # fmt: skip
        t, minutes = r.test, "—" if r.minutes is None else f"{r.minutes:.1f}"
        if t is None:
            cells = [*val, r.status, "—", "—", "—", "no", minutes, r.load or "—", "—", r.budget]
        else:
            tools = "—" if r.tool_calls is None else f"{fmt(r.tool_calls[0])} → {fmt(r.tool_calls[1])}"
            cells = [*val, f"{fmt(t.before)} → {fmt(t.after)}", fmt_gain(t.gain(), False),
                     f"{fmt(t.greedy_before)} → {fmt(t.greedy_after)}", fmt_gain(t.gain(greedy=True), False),
                     "**yes**" if r.learned else "no", minutes, r.load, tools, r.budget]  # fmt: skip
        lines.append(f"| {r.env} | {' | '.join(cells)} |")
    return lines


def result_line(rows: list[EnvRow]) -> str:
    """``RESULT envs=a,b,… learned=N of M rule=… split=test chosen_on=validation passed_validation=K of M``: M
    counts every selected env, run or not."""
    return (f"RESULT envs={','.join(r.env for r in rows)} learned={sum(r.learned for r in rows)} of {len(rows)} "
            f"rule=gain>10pp&>2SE split=test chosen_on=validation "
            f"passed_validation={sum(r.passed_validation for r in rows)} of {len(rows)}")  # fmt: skip


def plot(rows: list[EnvRow], path: Path) -> None:
    """Bars of held-out pass@1 before and after RL per env (envs without figures are labelled, not drawn)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1.3 * len(rows) + 2, 3.6))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r.test.before if r.test else 0.0 for r in rows], 0.4, label="warm start (SFT)",
           color="#999")  # fmt: skip
    ax.bar([x + 0.2 for x in xs], [r.test.after if r.test else 0.0 for r in rows], 0.4, label="after RL",
           color="#1f77b4")  # fmt: skip
    for x, r in zip(xs, rows, strict=True):
        if r.test is None:
            ax.text(x, 0.01, "no figure", ha="center", fontsize=8, rotation=90)
    ax.set_xticks(list(xs), [r.env for r in rows])
    ax.set_ylabel("test pass@1")
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
    args = parser.parse_args()
    overrides: tuple[str, ...] = ()
    if args.quick:
        args.envs, overrides = "calculator", QUICK
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
    print(result_line(rows))


if __name__ == "__main__":
    main()
