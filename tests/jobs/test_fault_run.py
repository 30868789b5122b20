"""`benchmarks/faults.py` in test size: a real `harmonyrl train` with injected tool faults loses no step and
masks exactly the faulted episodes, counted by class, in every step."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

from tiny_run import tiny_run

# A warm start that always uses the tool (80 steps at a high learning rate: the nano model then calls the
# calculator in some episodes), and half the tool calls failing, so that both kinds are hit in two steps.
CONFIG = tiny_run(
    "sft.steps=80",
    "sft.batch_size=8",
    "sft.lr=3e-3",
    "env.p_tool=1.0",
    "env.p_verbose=0",
    "rollout.tasks_per_step=4",
    "rollout.group_size=4",
    "rollout.max_new_tokens=48",
    "eval.n_tasks=1",
    "eval.samples_per_task=1",
    "env.n_train=640",
    "env.n_test=4",
    "env_faults.rate=0.5",
    "env_faults.kinds=[tool_timeout,tool_crash]",
    "threads=1",
    "telemetry.record_rollouts=false",
)


def by_prefix(row: dict[str, object], prefix: str) -> Counter[str]:
    return +Counter({k.removeprefix(prefix): int(v) for k, v in row.items() if k.startswith(prefix)})  # type: ignore[call-overload]


def test_a_run_with_injected_faults_loses_no_step_and_masks_exactly_the_faulted(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "harmonyrl.cli", "train", *CONFIG, f"output_dir={tmp_path}", "run_name=f"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    run = tmp_path / "f"
    rl = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["phase"] == "rl"]
    episodes = [json.loads(line) for line in (run / "rollouts" / "episodes.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rl] == [1, 2]  # no step lost
    total: Counter[str] = Counter()
    for r in rl:
        injected, failed = by_prefix(r, "env/injected_"), by_prefix(r, "env/failure_")
        recorded = Counter(e["failure"] for e in episodes if e["step"] == r["step"] and e["failure"])
        assert r["rollout/episodes"] == 16.0 and sum(e["step"] == r["step"] for e in episodes) == 16
        assert injected == failed == recorded  # every injected fault is one failed episode of its class
        assert r["train/masked_failures"] == sum(injected.values())  # ... and exactly those are masked
        assert r["rollout/failed"] == sum(injected.values())
        total += injected
    assert set(total) == {"tool_timeout", "tool_crash"}  # both kinds were exercised
