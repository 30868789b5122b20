"""A short real training run with 20 % of tool calls failing: is any step lost, is every faulted episode masked?

    python benchmarks/faults.py [--rate 0.2] [key=value ...]

The default model (``micro``) gets a short SFT warm start on the calculator task (enough that it calls the
tool), then RL steps in which ``env_faults.rate`` of the tool calls fail (:mod:`harmonyrl.envs.faults`), half as
timeouts (each costing ``timeout_delay_s`` of wall clock, as a real one would) and half as crashes. The run's
own records are then checked against each other:

* ``steps`` — RL rows in ``metrics.jsonl``; ``aborted_steps`` = configured − recorded (the run must finish);
* ``injected`` — what the injector says it injected (``env/injected_*``, by kind);
* ``masked`` — episodes the learner left out of the loss (``train/masked_failures``);
* ``by_class`` — environment failures by class (``env/failure_*``), which must equal the injected kinds, and
  the failure classes recorded in ``rollouts/episodes.jsonl``, which must agree with both.

Last line: ``RESULT injected=… masked=… aborted_steps=… steps=… by_class=… consistent=true|false``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.table import Table

from harmonyrl.config import load_config
from harmonyrl.jobs.train import train
from harmonyrl.telemetry.metrics import read_metrics

CONFIG = [
    "sft.steps=300",  # measured: ~45 % of episodes then call the tool (150 steps: ~35 %), so faults have calls to hit
    "rl.steps=10",
    "rollout.tasks_per_step=4",
    "rollout.group_size=8",
    "eval.n_tasks=16",
    "eval.samples_per_task=2",
    "env.n_train=4800",  # SFT draws steps × batch size = 4800 demonstrations
    "env.n_test=16",
    "env_faults.kinds=[tool_timeout,tool_crash]",
    "env_faults.timeout_delay_s=0.5",
    "threads=1",
]


def summed(rows: list[dict[str, object]], prefix: str) -> Counter[str]:
    """Per-key sums over ``rows`` of the metrics starting with ``prefix`` (key without the prefix)."""
    out: Counter[str] = Counter()
    for row in rows:
        for key, value in row.items():
            if key.startswith(prefix) and isinstance(value, int | float):
                out[key.removeprefix(prefix)] += int(value)
    return +out  # zero counts dropped


def is_call(message: dict[str, str | None]) -> bool:
    return (message["recipient"] or "").startswith("functions.")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=float, default=0.2, help="fraction of tool calls that fail")
    parser.add_argument("--out", type=Path, default=None, help="keep the run folder here (default: temp dir)")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="harmonyrl-faults-"))
    overrides = [*CONFIG, f"env_faults.rate={args.rate}", *args.overrides, f"output_dir={out}", "run_name=faults"]
    config = load_config(None, overrides)
    start = time.perf_counter()
    error = None
    try:
        asyncio.run(train(config, Console()))
    except Exception as exc:  # an aborted run is what this benchmark measures, not a reason to print nothing
        error = f"{type(exc).__name__}: {exc}"
    minutes = (time.perf_counter() - start) / 60
    run = out / "faults"
    metrics, recorded_episodes = run / "metrics.jsonl", run / "rollouts" / "episodes.jsonl"
    rl = [r for r in read_metrics(metrics) if r["phase"] == "rl"] if metrics.is_file() else []
    lines = recorded_episodes.read_text().splitlines() if recorded_episodes.is_file() else []
    episodes = [json.loads(line) for line in lines]

    injected = summed(rl, "env/injected_")
    failed = summed(rl, "env/failure_")
    recorded = Counter(e["failure"] for e in episodes if e["failure"] is not None)
    masked = sum(int(r["train/masked_failures"]) for r in rl)  # type: ignore[call-overload]
    complete = all(r["rollout/episodes"] == config.rollout.episodes_per_step for r in rl)
    aborted = config.rl.steps - len(rl)
    consistent = (
        error is None
        and sum(injected.values()) > 0  # else there was nothing to check
        and complete
        and masked == sum(injected.values())
        and injected == failed == recorded
        and len(episodes) == len(rl) * config.rollout.episodes_per_step
    )

    table = Table(title=f"{args.rate:.0%} of tool calls failing, {len(rl)} RL steps, {minutes:.1f} min")
    for col in ("step", "episodes", "tool calls", "injected", "failed (by class)", "masked", "reward", "trained"):
        table.add_column(col, justify="right")
    calls = Counter(e["step"] for e in episodes for t in e["turns"] for m in t["sampled"] if is_call(m))
    for r in rl:
        inj = sum(summed([r], "env/injected_").values())
        by = ", ".join(f"{k.removeprefix('tool_')} {v}" for k, v in sorted(summed([r], "env/failure_").items())) or "-"
        trained = "skipped" if r["train/skipped"] else "yes"
        row = (r["step"], r["rollout/episodes"], calls[r["step"]], inj, by, r["train/masked_failures"])
        table.add_row(
            *(str(int(v)) if isinstance(v, float) else str(v) for v in row), f"{r['rollout/reward']:.2f}", trained
        )
    Console(width=120).print(table)
    n_calls, n_injected = sum(calls.values()), sum(injected.values())
    print(f"tool calls {n_calls}, injected {n_injected} ({n_injected / max(n_calls, 1):.1%} of them)")
    if error is not None:
        print(f"the run aborted: {error}")
    by_class = ",".join(f"{k}:{v}" for k, v in sorted(failed.items())) or "none"
    print(
        f"RESULT injected={sum(injected.values())} masked={masked} aborted_steps={aborted} steps={len(rl)} "
        f"by_class={by_class} consistent={str(consistent).lower()}"
    )


if __name__ == "__main__":
    main()
