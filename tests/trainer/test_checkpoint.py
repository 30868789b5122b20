"""Invariant 7: checkpoints are written atomically; a failed save never damages the last good one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from harmonyrl.models.tiny_gpt_oss import build_config, build_model, load_model
from harmonyrl.trainer import checkpoint as ckpt


def _model(seed: int) -> torch.nn.Module:
    return build_model(build_config("nano", 64, 0, 1), seed=seed)


def test_save_then_load_round_trips(tmp_path: Path) -> None:
    model = _model(0)
    opt = torch.optim.AdamW(model.parameters())
    path = ckpt.save_checkpoint(tmp_path / "c", model, opt, step=7, extra={})
    loaded = load_model(path)
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    state = torch.load(path / "trainer_state.pt", weights_only=True)
    assert state["step"] == 7 and state["optimizer"] is not None and "rng_torch" in state


def test_failed_save_keeps_previous_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = ckpt.save_checkpoint(tmp_path / "c", _model(0), None, step=1, extra={})
    before = (path / "model.safetensors").read_bytes()

    def half_write(model: torch.nn.Module, folder: Path) -> None:
        (folder / "model.safetensors").write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(ckpt, "save_model", half_write)
    with pytest.raises(OSError, match="disk full"):
        ckpt.save_checkpoint(tmp_path / "c", _model(1), None, step=2, extra={})
    assert (path / "model.safetensors").read_bytes() == before
    assert torch.load(path / "trainer_state.pt", weights_only=True)["step"] == 1
    load_model(path)  # still a loadable checkpoint
