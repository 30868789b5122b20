"""A tiny ``harmonyrl train`` with LoRA (experts included), bf16 and activation checkpointing, end to end: its
checkpoints are plain GptOss with the merged weights that ``eval`` reads, the adapters saved beside them, and the
base weights never moved."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, GptOssForCausalLM
from typer.testing import CliRunner

from harmonyrl.cli import app
from harmonyrl.config import load_config
from harmonyrl.harmony.tokenizer import HarmonyTokenizer
from harmonyrl.models.lora import ADAPTER_FILE, merged_state_dict
from harmonyrl.run.setup import make_model, resume_model
from tiny_run import tiny_run

LORA = (
    "model.lora.r=4",
    "model.lora.targets=[q_proj,k_proj,v_proj,o_proj,experts]",
    "model.precision=bf16",
    "model.gradient_checkpointing=true",
    "rl.lr=1e-2",
)


def test_a_lora_bf16_checkpointed_run_writes_plain_merged_checkpoints(tmp_path: Path) -> None:
    overrides = tiny_run(*LORA)
    result = CliRunner().invoke(app, ["train", *overrides, f"output_dir={tmp_path}", "run_name=lora"])
    assert result.exit_code == 0, result.output
    final = tmp_path / "lora" / "checkpoints" / "final"
    loaded = AutoModelForCausalLM.from_pretrained(final, dtype=torch.float32)
    assert type(loaded) is GptOssForCausalLM
    assert not any("lora_" in k or "base_layer" in k for k in loaded.state_dict())
    # the merged weights are base + the saved adapters, and the base is the run's seeded start, untouched
    config = load_config(None, overrides)
    tok = HarmonyTokenizer.load_default()
    base = make_model(config, tok)
    again = resume_model(config, tok, final)
    for key, value in merged_state_dict(again).items():
        assert torch.equal(value, loaded.state_dict()[key]), key
    adapters = load_file(final / ADAPTER_FILE)
    assert any(v.abs().sum() > 0 for k, v in adapters.items() if "lora_B" in k)  # it trained
    for (key, b), a in zip(base.state_dict().items(), again.state_dict().values(), strict=True):
        assert "lora_" in key or torch.equal(a, b), key
    ev = CliRunner().invoke(app, ["eval", "--checkpoint", str(final), "eval.n_tasks=2", "env.n_train=64",
                                  "env.n_test=8"])  # fmt: skip
    assert ev.exit_code == 0, ev.output
