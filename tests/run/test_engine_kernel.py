"""What the run header says the engine decodes with, and why it fell back to eager torch."""

from __future__ import annotations

import pytest

import harmonyrl.engine.local.native as native
from harmonyrl.config import load_config
from harmonyrl.errors import KernelUnavailable
from harmonyrl.models.tiny_gpt_oss import build_config, build_model
from harmonyrl.run.setup import check_engine

MODEL = build_model(build_config("nano", 300, 0, 1), seed=0)


def test_auto_uses_the_compiled_step_and_names_its_build() -> None:
    label = check_engine(load_config(), MODEL)
    assert label == f"decode native ({native.isa()})" and native.isa() in ("avx2", "generic")


def test_torch_asked_for_is_plain_torch() -> None:
    assert check_engine(load_config(overrides=["rollout.engine.kernel=torch"]), MODEL) == "decode torch"


def test_auto_falls_back_to_torch_and_says_why() -> None:
    config = load_config(overrides=["rollout.engine.dtype=bfloat16"])
    assert (
        check_engine(config, MODEL) == "decode torch (it computes in float32 only, the engine runs in torch.bfloat16)"
    )


def test_auto_without_the_build_says_it_was_not_built(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "library", lambda: None)
    assert "was not built" in check_engine(load_config(), MODEL)
    with pytest.raises(KernelUnavailable, match="was not built"):
        check_engine(load_config(overrides=["rollout.engine.kernel=native"]), MODEL)
