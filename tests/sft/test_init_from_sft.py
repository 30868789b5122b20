"""``model.init_from`` resolves ``sft.steps`` to 0 unless it is given; the run says which SFT it does."""

from __future__ import annotations

from pathlib import Path

import pytest

from harmonyrl.config import ModelConfig, RunConfig, SFTConfig, load_config
from harmonyrl.run.setup import sft_plan


@pytest.fixture()
def ckpt(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text("{}")
    return tmp_path


def test_init_from_defaults_sft_steps_to_zero(ckpt: Path) -> None:
    assert load_config(None, []).sft.steps == 500
    assert load_config(None, [f"model.init_from={ckpt}"]).sft.steps == 0
    kept = load_config(None, [f"model.init_from={ckpt}", "sft.lr=0.01"]).sft  # a partial sft section
    assert kept.steps == 0 and kept.lr == 0.01
    assert RunConfig(model=ModelConfig(init_from=ckpt)).sft.steps == 0  # built in Python, too
    assert RunConfig(model=ModelConfig(init_from=ckpt), sft=SFTConfig(lr=0.5)).sft.steps == 0


def test_explicit_sft_steps_are_kept_with_init_from(ckpt: Path) -> None:
    assert load_config(None, [f"model.init_from={ckpt}", "sft.steps=7"]).sft.steps == 7
    assert load_config(None, [f"model.init_from={ckpt}", "sft.steps=500"]).sft.steps == 500  # the default, but said
    assert RunConfig(model=ModelConfig(init_from=ckpt), sft=SFTConfig(steps=3)).sft.steps == 3
    yaml_file = ckpt / "run.yaml"
    yaml_file.write_text(f"model:\n  init_from: {ckpt}\nsft:\n  steps: 4\n")
    assert load_config(yaml_file, []).sft.steps == 4


def test_sft_plan_says_what_runs(ckpt: Path) -> None:
    assert sft_plan(load_config(None, [])) is None  # the default: the progress bar says it
    assert sft_plan(load_config(None, ["sft.steps=0"])) == "SFT warm start: none (sft.steps=0)"
    assert sft_plan(load_config(None, [f"model.init_from={ckpt}"])) == (
        f"SFT warm start: none, model.init_from={ckpt} is the warm start (sft.steps=N would run N steps from it)"
    )
    assert sft_plan(load_config(None, [f"model.init_from={ckpt}", "sft.steps=9"])) == (
        f"SFT warm start: 9 steps from model.init_from={ckpt} (sft.steps given)"
    )
