"""Does every built-in environment learn? One RL run per env from its preset, held-out success before → after.

    python benchmarks/envs.py [--envs maze,sql] [--out DIR] [--deadline HH:MM] [--table-only]

Each env runs ``harmonyrl train -c src/harmonyrl/presets/<env>.yaml threads=1`` in a subprocess (SFT warm start
on the env's scripted expert → held-out eval → RL → held-out eval), one after the other, cheapest first. An env
*learned* when its held-out pass@1 (``eval/success``, sampled at T=1) rose by at least 10 points from its warm
start. Finished runs in ``--out`` are reused and a stopped one is resumed (``--resume``), so an interrupted
benchmark continues where it stopped; a run whose preset now sets other values is refused (delete its folder). With
``--deadline`` (UTC), a run still going then is stopped (kept for resuming) and envs not started are reported as
"not run (budget)" — never a made-up figure. Writes ``envs.md`` (the table) and ``envs.png`` (before → after
per env) into ``--out``. Last line: ``RESULT envs=a,b,… learned=N of M`` (M: the selected envs, run or not).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import harmonyrl
from harmonyrl.config import RunConfig, load_config
from harmonyrl.tasks.factory import make_factory

ENVS = ("calculator", "retool", "sql", "instruct", "maze", "browse", "humaneval")
"""Every built-in env, in the order they run (cheapest first, as measured by a probe on 2026-11-25)."""
PRESETS = Path(harmonyrl.__file__).parent / "presets"
LEARNED = 0.10
"""Rise in held-out pass@1 (absolute) that counts as learning."""


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

    @property
    def learned(self) -> bool:
        """Held-out pass@1 rose by at least :data:`LEARNED` from the warm start."""
        return self.before is not None and self.after is not None and self.after - self.before >= LEARNED - 1e-9


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


def read_row(env: str, preset: Path, out: Path, status_if_missing: str) -> EnvRow:
    """The row of ``env`` from its run folder ``out/env`` (``summary.json``); without one, ``status_if_missing``,
    or where the run stopped if an earlier invocation started it (it was not run *this* time). A run of an older
    preset has no figures here: they would stand beside the new preset's budget."""
    cfg = load_config(preset, [])
    budget = budget_of(cfg)
    run = out / env
    if ran_another_preset(env, preset, out):
        return EnvRow(env, budget, f"ran an older preset (delete {run} to run this one)")
    summary = run / "summary.json"
    if not summary.is_file():
        started = status_if_missing == "not run (budget)" and (run / "metrics.jsonl").is_file()
        return EnvRow(env, budget, where_stopped(run) if started else status_if_missing)
    s = json.loads(summary.read_text())
    side = out / f"{env}.bench.json"
    load = json.loads(side.read_text()).get("load", "") if side.is_file() else ""
    return EnvRow(env, budget, "done", s["success_before"], s["success_after"], s["greedy_success_before"],
                  s["greedy_success_after"], s["minutes"], load,
                  tool_call_rates(run / "metrics.jsonl") if has_tools(cfg) else None)  # fmt: skip


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


def run_env(env: str, preset: Path, out: Path, timeout_s: float | None) -> str:
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
        cmd = ["harmonyrl", "train", "-c", str(preset), "threads=1", f"output_dir={out}", f"run_name={env}"]
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


def table(rows: list[EnvRow]) -> list[str]:
    """The markdown table: one row per env; an env without figures says why in the result column."""
    lines = ["| env | held-out pass@1 before → after | gain (pp) | greedy before → after | learned | minutes | "
             "load avg 1/5/15 min, start → end | tool calls before → after | budget |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        if r.before is None or r.after is None:
            lines.append(f"| {r.env} | {r.status} | — | — | no | — | — | — | {r.budget} |")
            continue
        gain = f"{100 * (r.after - r.before):+.1f}"
        greedy = f"{fmt(r.greedy_before)} → {fmt(r.greedy_after)}"
        tools = "—" if r.tool_calls is None else f"{fmt(r.tool_calls[0])} → {fmt(r.tool_calls[1])}"
        learned = "**yes**" if r.learned else "no"
        lines.append(f"| {r.env} | {fmt(r.before)} → {fmt(r.after)} | {gain} | {greedy} | {learned} | "
                     f"{r.minutes:.1f} | {r.load} | {tools} | {r.budget} |")  # fmt: skip
    return lines


def result_line(rows: list[EnvRow]) -> str:
    """``RESULT envs=a,b,… learned=N of M``: M counts every selected env, run or not."""
    return f"RESULT envs={','.join(r.env for r in rows)} learned={sum(r.learned for r in rows)} of {len(rows)}"


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


def parse_envs(text: str) -> list[str]:
    """The ``--envs`` list, in the benchmark's order; an unknown name is a one-line error."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in ENVS]
    if unknown or not names:
        sys.exit(f"error: --envs: unknown env {', '.join(unknown) or '(none given)'}; choose from {','.join(ENVS)}")
    return [e for e in ENVS if e in names]


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
    args = parser.parse_args()
    envs = parse_envs(args.envs)
    args.out.mkdir(parents=True, exist_ok=True)
    status: dict[str, str] = {}
    for env in envs:
        left = seconds_left(args.deadline)
        if args.table_only or (left is not None and left <= 0):
            continue
        status[env] = run_env(env, args.presets / f"{env}.yaml", args.out, left)
    rows = [read_row(e, args.presets / f"{e}.yaml", args.out, status.get(e, "not run (budget)")) for e in envs]
    lines = table(rows)
    (args.out / "envs.md").write_text("\n".join(lines) + "\n")
    plot(rows, args.out / "envs.png")
    print("\n".join(lines))
    print(f"table: {args.out / 'envs.md'}  plot: {args.out / 'envs.png'}  load average now {_load()}")
    print(result_line(rows))


if __name__ == "__main__":
    main()
