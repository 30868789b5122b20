"""``harmonyrl sft`` saves resumable progress and resumes losslessly; so does ``train`` stopped during SFT."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

import harmonyrl.sft.warm_start as warm_start
from harmonyrl.cli import app

runner = CliRunner()
SFT = [
    "model.preset=nano",
    "sft.steps=7",
    "sft.batch_size=4",
    "sft.checkpoint_every=3",
    "env.n_train=64",
    "env.n_test=8",
    "threads=1",
]
TRAIN = [*SFT, "rl.steps=0", "eval.n_tasks=2", "eval.samples_per_task=1", "rollout.max_new_tokens=16"]


class Killed(BaseException):
    """Stands in for the process dying (BaseException, like KeyboardInterrupt: no handler may swallow it)."""


def _stop_at_call(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    """Make the n-th SFT step (1-based) die before it changes anything."""
    real, calls = warm_start.sft_step, [0]

    def step(*args: object) -> float:
        calls[0] += 1
        if calls[0] == n:
            raise Killed
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(warm_start, "sft_step", step)


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def _sft_rows(run: Path) -> list[dict[str, object]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["phase"] == "sft"]


def _assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)  # bit-identical, not close


def test_sft_checkpoints_and_resumes_bit_identically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    whole = runner.invoke(app, ["sft", *SFT, f"output_dir={tmp_path}", "run_name=whole"])
    assert whole.exit_code == 0, whole.output
    last = torch.load(tmp_path / "whole/checkpoints/last/trainer_state.pt", weights_only=False)
    assert last["phase"] == "sft" and last["step"] == 6  # saved after steps 3 and 6 of 7 (the end is checkpoints/sft)

    _stop_at_call(monkeypatch, 6)  # dies in step 6: steps 1-5 ran, the last save was after step 3
    with pytest.raises(Killed):
        runner.invoke(app, ["sft", *SFT, f"output_dir={tmp_path}", "run_name=cut"])
    run = tmp_path / "cut"
    assert not (run / "checkpoints" / "sft").exists() and len(_sft_rows(run)) == 5
    monkeypatch.undo()

    again = runner.invoke(app, ["sft", "--resume", str(run)])
    assert again.exit_code == 0, again.output
    assert "resuming after sft step 3" in " ".join(again.output.split())  # continued, did not start over
    _assert_same_weights(run / "checkpoints" / "sft", tmp_path / "whole" / "checkpoints" / "sft")
    assert _sft_rows(run) == _sft_rows(tmp_path / "whole")  # rows 4-5 of the dead process were rewound

    done = runner.invoke(app, ["sft", "--resume", str(run)])
    assert done.exit_code == 0 and "finished its warm start already" in " ".join(done.output.split())


def test_train_stopped_during_sft_continues_sft(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    whole = runner.invoke(app, ["train", *TRAIN, f"output_dir={tmp_path}", "run_name=whole"])
    assert whole.exit_code == 0, whole.output
    _stop_at_call(monkeypatch, 5)
    with pytest.raises(Killed):
        runner.invoke(app, ["train", *TRAIN, f"output_dir={tmp_path}", "run_name=cut"])
    monkeypatch.undo()
    again = runner.invoke(app, ["train", "--resume", str(tmp_path / "cut")])
    assert again.exit_code == 0, again.output
    assert "resuming after sft step 3" in " ".join(again.output.split())
    _assert_same_weights(tmp_path / "cut" / "checkpoints" / "sft", tmp_path / "whole" / "checkpoints" / "sft")
    _assert_same_weights(tmp_path / "cut" / "checkpoints" / "final", tmp_path / "whole" / "checkpoints" / "final")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["sft", "--resume", "{tmp}", "sft.steps=3"], "do not pass --config, overrides or --overwrite"),
        (["sft", "--resume", "{tmp}"], "not a run folder (no config.yaml)"),
    ],
)
def test_sft_resume_mistakes_are_one_line_errors(tmp_path: Path, args: list[str], expected: str) -> None:
    result = runner.invoke(app, [a.format(tmp=tmp_path) for a in args])
    assert result.exit_code == 2 and expected in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
