"""Invariant 7: checkpoints are written atomically; a failed save never damages the last good one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from harmonyrl.models.tiny_gpt_oss import build_config, build_model, load_model
from harmonyrl.run import checkpoint as ckpt


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


def test_a_save_cut_between_its_two_renames_leaves_the_previous_checkpoint_readable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = ckpt.save_checkpoint(tmp_path / "c", _model(0), None, step=1, extra={})
    real_replace = ckpt.os.replace
    calls: list[str] = []

    def crash_on_second(src: object, dst: object) -> None:
        calls.append(str(dst))
        if len(calls) == 2:  # ``c -> c.old`` done, ``c.tmp -> c`` not yet: the process dies here
            raise KeyboardInterrupt
        real_replace(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(ckpt.os, "replace", crash_on_second)
    with pytest.raises(KeyboardInterrupt):
        ckpt.save_checkpoint(path, _model(1), None, step=2, extra={})
    monkeypatch.setattr(ckpt.os, "replace", real_replace)
    assert not path.exists()
    found = ckpt.committed(path)
    assert found == tmp_path / "c.old" and ckpt.load_state(found)["step"] == 1  # not "no checkpoint"
    ckpt.save_checkpoint(path, _model(2), None, step=3, extra={})  # the next save recovers the layout
    assert ckpt.committed(path) == path and ckpt.load_state(path)["step"] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]


def test_a_crafted_state_is_refused_without_running(tmp_path: Path) -> None:
    marker = tmp_path / "marker"

    class Payload:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (exec, (f"open({str(marker)!r}, 'w').write('pwned')",))

    (tmp_path / "c").mkdir()
    torch.save({"step": 1, "evil": Payload()}, tmp_path / "c" / "trainer_state.pt")
    torch.load(tmp_path / "c" / "trainer_state.pt", weights_only=False)  # proves the payload is live
    assert marker.exists()
    marker.unlink()
    with pytest.raises(ckpt.CheckpointError, match="refusing to load"):
        ckpt.load_state(tmp_path / "c")
    assert not marker.exists()


def test_a_full_disk_while_writing_weights_is_an_os_error_and_frees_the_temp_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """safetensors reports ENOSPC as its own error type; the checkpoint turns it into the OSError it is."""
    path = ckpt.save_checkpoint(tmp_path / "c", _model(0), None, step=1, extra={})

    class SafetensorError(Exception):
        pass

    def full(model: torch.nn.Module, folder: Path) -> None:
        (folder / "model.safetensors").write_bytes(b"partial")
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(ckpt, "save_model", full)
    with pytest.raises(OSError) as info:
        ckpt.save_checkpoint(path, _model(1), None, step=2, extra={})
    assert info.value.errno == 28 and info.value.filename == str(tmp_path / "c.tmp")
    assert not (tmp_path / "c.tmp").exists() and ckpt.load_state(path)["step"] == 1
