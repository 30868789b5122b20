"""A nano `harmonyrl train env.name=relay` end to end: the team warm start, team rollouts, the unchanged update
training on both roles' trajectories, per-role metrics in training and held-out evaluation."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tiny_run import tiny_run

# An entropy bonus and no zero-variance skipping: both steps are real updates even when every reward is 0.
CONFIG = tiny_run(
    "env.name=relay",
    "eval.n_tasks=2",
    "eval.samples_per_task=1",
    "rl.entropy_coef=0.01",
    "rl.skip_zero_variance_groups=false",
    "threads=1",
)


def test_a_team_run_trains_both_roles_and_logs_them_apart(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "harmonyrl.cli", "train", *CONFIG, f"output_dir={tmp_path}", "run_name=t"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    run = tmp_path / "t"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r["phase"] == "rl"]
    assert [r["step"] for r in rl] == [1, 2]
    for r in rl:  # 2 tasks × 2 episodes, each a planner's and an executor's trajectory, all trained on
        assert r["rollout/episodes"] == 8.0 and r["train/episodes"] == 8.0 and r["train/skipped"] == 0.0
        assert r["team/planner/episodes"] == r["team/executor/episodes"] == 4.0
        assert r["team/planner/tool_call_rate"] == 0.0  # the planner has no tool to call
        assert {"team/planner/response_tokens", "team/executor/parse_error_rate"} <= r.keys()
    evals = [r for r in rows if r["phase"] == "eval"]
    assert len(evals) == 2 and all(r["eval_team/executor/episodes"] == 2.0 for r in evals)
    episodes = (run / "rollouts" / "episodes.jsonl").read_text().splitlines()
    assert len(episodes) == 2 * 8
    roles = [json.loads(line)["team_role"] for line in episodes]  # each line names the role that played it
    assert sorted(set(roles)) == ["executor", "planner"] and roles.count("planner") == roles.count("executor") == 8
