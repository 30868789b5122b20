"""Optional writers: TensorBoard events read back, W&B offline with no account, clear errors when not installed."""

from __future__ import annotations

import importlib.util
import math
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from harmonyrl.telemetry.metrics import JsonlWriter, read_metrics
from harmonyrl.telemetry.writers import MultiWriter, TensorBoardWriter, WandbWriter, WriterUnavailableError

HAS_TENSORBOARD = importlib.util.find_spec("tensorboard") is not None
HAS_WANDB = importlib.util.find_spec("wandb") is not None


def _write_run(writer: MultiWriter | TensorBoardWriter | WandbWriter) -> None:
    for step in range(3):
        writer.write(step, {"sft/loss": 3.0 - step}, "sft")
    writer.write(0, {"eval/success": 0.25}, "eval")
    writer.write(1, {"rollout/reward": 0.5, "train/grad_norm": float("nan")}, "rl")
    writer.write(2, {"rollout/reward": 0.75, "train/grad_norm": 1.5}, "rl")


@pytest.mark.skipif(not HAS_TENSORBOARD, reason="tensorboard is not installed (pip install tensorboard)")
def test_tensorboard_events_read_back(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    writer = TensorBoardWriter(tmp_path)
    _write_run(writer)
    writer.close()
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    assert {"sft/loss", "eval/success", "rollout/reward", "train/grad_norm"} <= set(acc.Tags()["scalars"])
    loss = acc.Scalars("sft/loss")
    assert [e.step for e in loss] == [0, 1, 2]
    assert [e.value for e in loss] == pytest.approx([3.0, 2.0, 1.0])
    assert [(e.step, e.value) for e in acc.Scalars("rollout/reward")] == [(1, 0.5), (2, 0.75)]
    grad = acc.Scalars("train/grad_norm")
    assert math.isnan(grad[0].value) and grad[1].value == pytest.approx(1.5)


def test_tensorboard_missing_names_the_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # makes `import tensorboard` fail
    with pytest.raises(WriterUnavailableError, match=r"harmonyrl\[tensorboard\]"):
        TensorBoardWriter(tmp_path)


def test_wandb_missing_names_the_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(WriterUnavailableError, match=r"harmonyrl\[wandb\]"):
        WandbWriter(tmp_path, "r")


@pytest.mark.skipif(not HAS_WANDB, reason="wandb is not installed (optional extra)")
def test_wandb_offline_needs_no_account(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    writer = WandbWriter(tmp_path, "offline-test", config={"seed": 0})
    _write_run(writer)
    writer.close()
    # wandb ships no reader for its offline log; the keys are stored as plain strings in the protobuf records
    (log,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    data = log.read_bytes()
    for key in (b"sft/loss", b"sft/step", b"rl/step", b"rollout/reward", b"eval/success"):
        assert key in data


class _Recorder:
    def __init__(self, fail_close: bool = False) -> None:
        self.rows: list[tuple[int, dict[str, float], str]] = []
        self.closed = False
        self.fail_close = fail_close

    def write(self, step: int, metrics: Mapping[str, float], phase: str) -> None:
        self.rows.append((step, dict(metrics), phase))

    def close(self) -> None:
        self.closed = True
        if self.fail_close:
            raise OSError("disk full")


def test_multisink_fans_out_and_closes_everything(tmp_path: Path) -> None:
    a, b = _Recorder(fail_close=True), _Recorder()
    jsonl = JsonlWriter(tmp_path / "metrics.jsonl")
    writer = MultiWriter([a, jsonl, b])
    _write_run(writer)
    with pytest.raises(OSError, match="disk full"):
        writer.close()
    assert a.closed and b.closed
    assert a.rows == b.rows and len(a.rows) == 6
    assert len(read_metrics(tmp_path / "metrics.jsonl")) == 6
