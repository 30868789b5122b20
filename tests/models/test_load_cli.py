"""Real-checkpoint layouts through the command line: ``check-checkpoint`` accepts them, ``eval --checkpoint`` runs on
each, and ``train model.init_from=DIR`` trains from them (a tiny model with the shipped tokenizer's vocabulary, so
the vocabulary check passes)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from ckpt_writers import write_bf16_sharded, write_mxfp4, write_original
from transformers import GptOssForCausalLM
from typer.testing import CliRunner

from harmonyrl.cli import app
from harmonyrl.harmony.tokenizer import HarmonyTokenizer
from harmonyrl.models.tiny_gpt_oss import build_config, build_model
from tiny_run import tiny_run

runner = CliRunner()
LAYOUTS: dict[str, Callable[[GptOssForCausalLM, Path], Path]] = {
    "mxfp4": write_mxfp4,
    "bf16-sharded": write_bf16_sharded,
    "original": write_original,
}


@pytest.fixture(scope="module")
def source() -> GptOssForCausalLM:
    tok = HarmonyTokenizer.load_default()
    return build_model(build_config("nano", tok.vocab_size, tok.special.endoftext, tok.special.return_), seed=0)


@pytest.mark.parametrize("layout", ["mxfp4", "bf16-sharded"])
def test_check_checkpoint_accepts_the_hf_layouts(tmp_path: Path, source: GptOssForCausalLM, layout: str) -> None:
    folder = LAYOUTS[layout](source, tmp_path / layout)
    result = runner.invoke(app, ["check-checkpoint", str(folder)])
    assert result.exit_code == 0, result.output
    assert ("4 expert matrices stored as MXFP4" in result.output) == (layout == "mxfp4"), result.output
    assert " parameters (" in result.output and "(0.00 B)" not in result.output  # a tiny model's count, at its scale


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_eval_runs_on_each_layout(tmp_path: Path, source: GptOssForCausalLM, layout: str) -> None:
    folder = LAYOUTS[layout](source, tmp_path / layout)
    result = runner.invoke(
        app, ["eval", "--checkpoint", str(folder), "eval.n_tasks=2", "env.n_train=64", "env.n_test=8"]
    )
    assert result.exit_code == 0, result.output
    assert "eval/success" in result.output and "eval_greedy/success" in result.output


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_train_from_each_layout(tmp_path: Path, source: GptOssForCausalLM, layout: str) -> None:
    folder = LAYOUTS[layout](source, tmp_path / layout)
    args = ["train", *tiny_run("sft.steps=0", "rl.steps=1"), f"model.init_from={folder}"]
    result = runner.invoke(app, [*args, f"output_dir={tmp_path / 'runs'}", "run_name=r"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "runs" / "r" / "checkpoints" / "final" / "model.safetensors").is_file()


def test_check_checkpoint_names_the_original_layout(tmp_path: Path, source: GptOssForCausalLM) -> None:
    result = runner.invoke(app, ["check-checkpoint", str(write_original(source, tmp_path / "original"))])
    assert result.exit_code == 2 and "is OpenAI's original layout" in result.output, result.output
