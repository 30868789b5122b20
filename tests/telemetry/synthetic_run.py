"""A synthetic run folder with every metric family the report draws, plus episodes that try to inject HTML."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

from harmonyrl.telemetry.episodes import append_episodes
from harmonyrl.types import Failure, Message, Trajectory, Turn

XSS = "<script>alert('pwned')</script>"
RL_STEPS = 6


def trajectory(
    task_id: str, reward: float, failure: Failure | None = None, content: str = "2+2", parse_error: str | None = None
) -> Trajectory:
    call = Message("assistant", json.dumps({"expression": content}), "commentary", "functions.calculator", None, "json")
    result = Message("tool", "4", "commentary", "assistant", "functions.calculator")
    final = Message("assistant", "The answer is 4.", "final")
    turns = (
        Turn((Message("assistant", "I should use the tool.", "analysis"), call), None, (result,), 0.2, 0.05),
        Turn((final,), parse_error, (), 0.1, 0.0),
    )
    traj = Trajectory(task_id, 0, (1, 2, 3), (0, 1, 1), (0.0, -0.5, -0.1), reward, True, False, failure, turns)
    return dataclasses.replace(
        traj, reward_terms={"correct": float(reward > 0.5)}, task_prompt="What is 2 + 2?", expected_answer="4"
    )


def write_synthetic_run(run_dir: Path, with_episodes: bool = True) -> Path:
    run_dir.mkdir(parents=True)
    rows: list[dict[str, object]] = [
        {"step": s, "phase": "sft", "sft/loss": 7.0 * math.exp(-s / 6), "sft/lr": 1e-3} for s in range(20)
    ]
    rows.append({"step": 0, "phase": "eval", "eval/success": 0.1, "eval_greedy/success": 0.0, "eval/pass@4": 0.3})
    for s in range(1, RL_STEPS + 1):
        x = s / RL_STEPS
        row: dict[str, object] = {"step": s, "phase": "rl"}
        row |= {"rollout/reward": 0.2 + 0.6 * x, "rollout/success": 0.1 + 0.7 * x, "rollout/failed": float(s % 3 == 0)}
        row |= {"rollout/tool_call_rate": 0.5 + 0.4 * x, "rollout/parse_error_rate": 0.4 * (1 - x)}
        row |= {"rollout/truncated_rate": 0.1, "rollout/response_tokens": 40 - 10 * x, "rollout/turns": 2.0}
        row |= {"train/loss": 0.1 - 0.05 * x, "train/clip_fraction": 0.05 * x, "train/entropy": 1.5 - x}
        row |= {"train/grad_norm": "nan" if s == 2 else 0.5 + x, "train/kl_ref_k3": 0.01 * s}
        row |= {"train/ratio_max_dev_first_mb": 0.0, "mismatch/kl_k1": 1e-4 * s, "mismatch/kl_k3": 5e-5 * s}
        row |= {"mismatch/ess_token": 0.99, "mismatch/chi2_token": 0.01 * x, "is/weight_mean": 1.0 + 0.01 * x}
        row |= {"time/rollout_s": 2.0 + x, "time/train_s": 1.0, "time/step_s": 3.2 + x}
        row |= {"time/episode_generation_s": 6.0, "time/episode_tool_s": 1.5}
        if s % 3 == 0:
            row["env/failure_tool_timeout"] = 1.0
        if s == 5:
            row["env/failure_sandbox_error"] = 2.0
        rows.append(row)
    rows.append({"step": RL_STEPS, "phase": "eval", "eval/success": 0.6, "eval_greedy/success": 0.5})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run_dir / "config.yaml").write_text("seed: 0\nrun_name: synthetic <b>run</b>\nrl:\n  steps: 6\n")
    (run_dir / "summary.json").write_text(json.dumps({"success_before": 0.1, "success_after": 0.6, "minutes": 1.5}))
    if with_episodes:
        path = run_dir / "rollouts" / "episodes.jsonl"
        bad = trajectory("calc-1", 0.0, parse_error="expected <|message|> after <|channel|>")
        append_episodes(path, [bad, trajectory("calc-2", 1.0)], step=1)
        timeout = Failure("tool_timeout", "calculator took > 5 s")
        append_episodes(path, [trajectory("calc-9", 1.0, content=XSS), trajectory("calc-3", 0.0, timeout)], step=6)
    return run_dir


ALL_TITLES = [
    "Reward and success",
    "KL divergence",
    "Entropy",
    "Gradient norm",
    "Clip fraction",
    "Train/inference mismatch",
    "Importance weights",
    "Response length",
    "Tool-call rate",
    "Parse errors",
    "Failures by class",
    "SFT loss",
    "Where the time went",
]
