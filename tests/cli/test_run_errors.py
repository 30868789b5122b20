"""What a user sees when a run, a resume or a replay goes wrong: one line, the right exit code, no traceback,
and a run folder left as it was (invariants 7 and 8).

One tiny run is trained once per module; each case works on its own copy of the folder.
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner, Result

import harmonyrl.jobs.train as loop_module
import harmonyrl.rl.collect as collect_module
import harmonyrl.run.checkpoint as checkpoint_module
from harmonyrl.cli import app
from tiny_run import snapshot

runner = CliRunner()
TINY = [
    "model.preset=nano",
    "sft.steps=2",
    "sft.batch_size=4",
    "rl.steps=2",
    "rollout.tasks_per_step=2",
    "rollout.group_size=2",
    "rollout.max_new_tokens=16",
    "eval.n_tasks=2",
    "eval.samples_per_task=1",
    "env.n_train=64",
    "env.n_test=8",
    "threads=1",
]


def one_line_error(result: Result, code: int = 2) -> str:
    """The single line a failed command printed (asserting the exit code and the absence of a traceback)."""
    lines = result.output.strip().splitlines()
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output, result.output
    assert len(lines) >= 1 and lines[-1].startswith("error:"), result.output
    return " ".join(result.output.split())  # rich may wrap a long line; judge the text


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("runs")
    result = runner.invoke(app, ["train", *TINY, f"output_dir={out}", "run_name=done"])
    assert result.exit_code == 0, result.output
    return out / "done"


@pytest.fixture
def run(finished_run: Path, tmp_path: Path) -> Iterator[Path]:
    copy = tmp_path / "run"
    shutil.copytree(finished_run, copy)
    yield copy


def resume(run: Path) -> Result:
    return runner.invoke(app, ["train", "--resume", str(run)])


# ---- a failed resume changes nothing --------------------------------------------------------------------


def test_an_unreadable_checkpoint_fails_the_resume_before_any_file_is_rewound(run: Path) -> None:
    (run / "checkpoints" / "last" / "model.safetensors").write_bytes(b"\x00garbage" * 64)
    before = snapshot(run)
    text = one_line_error(resume(run))
    assert "cannot load checkpoint" in text
    assert snapshot(run) == before  # the final eval row after the checkpoint is still there


def test_a_short_metrics_file_is_a_one_line_error_and_changes_nothing(run: Path) -> None:
    metrics = run / "metrics.jsonl"
    metrics.write_bytes(b"".join(metrics.read_bytes().splitlines(keepends=True)[:3]))
    before = snapshot(run)
    text = one_line_error(resume(run))
    assert "metrics.jsonl' has 3 complete lines but the checkpoint at rl step 2 recorded" in text
    assert snapshot(run) == before


def test_a_metrics_file_that_is_not_utf8_is_a_one_line_error_and_changes_nothing(run: Path) -> None:
    metrics = run / "metrics.jsonl"
    metrics.write_bytes(metrics.read_bytes().replace(b'"phase"', b'"ph\xffse"', 1))
    before = snapshot(run)
    text = one_line_error(resume(run))
    assert "metrics.jsonl' line 1 is not UTF-8 text" in text
    assert snapshot(run) == before


def test_a_torn_last_row_after_the_checkpoint_is_cut_not_an_error(run: Path) -> None:
    """What a kill -9 leaves: a half-written row (even invalid UTF-8) after the checkpoint's lines."""
    metrics = run / "metrics.jsonl"
    kept = metrics.read_bytes()
    metrics.write_bytes(kept + b'{"step": 3, "ph\xff')
    result = resume(run)
    assert result.exit_code == 0, result.output
    assert "resuming after rl step 2" in " ".join(result.output.split())


def test_a_read_only_run_folder_is_a_one_line_error_and_changes_nothing(
    run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.access
    monkeypatch.setattr(
        os, "access", lambda p, mode: (mode != os.W_OK or Path(p) != run) and real(p, mode)
    )  # a ro mount
    before = snapshot(run)
    text = one_line_error(resume(run))
    assert f"'{run}' is not writable" in text
    assert snapshot(run) == before


# ---- the checkpoint's two renames ------------------------------------------------------------------------


def test_a_resume_cut_between_the_checkpoint_renames_continues_from_the_previous_checkpoint(run: Path) -> None:
    last = run / "checkpoints" / "last"
    os.replace(last, last.with_name("last.old"))  # the state between ``last -> last.old`` and ``last.tmp -> last``
    result = resume(run)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "resuming after rl step 2" in text and "held-out before RL" in text  # not a silent restart from step 0
    assert [json.loads(r)["phase"] for r in (run / "metrics.jsonl").read_text().splitlines()].count("sft") == 2


# ---- run folders are data, not code ----------------------------------------------------------------------


class Payload:
    """Pickles to a call that writes a marker file: what a crafted run folder would hide in its state."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (exec, (f"open({str(self.marker)!r}, 'w').write('pwned')",))


def plant(folder: Path, marker: Path, as_torch_file: bool) -> None:
    """Write the crafted state, and prove it is live: an unsafe load of it does write the marker."""
    state = {"step": 1, "phase": "rl", "x": Payload(marker)}
    path = folder / "trainer_state.pt"
    if as_torch_file:
        torch.save(state, path)
        torch.load(path, weights_only=False)  # the unsafe load the product must never do
    else:
        path.write_bytes(pickle.dumps(state))
        pickle.loads(path.read_bytes())
    assert marker.exists()
    marker.unlink()


@pytest.mark.parametrize("as_torch_file", [True, False])
def test_a_crafted_state_does_not_execute_on_resume(run: Path, tmp_path: Path, as_torch_file: bool) -> None:
    marker = tmp_path / "marker"
    plant(run / "checkpoints" / "last", marker, as_torch_file)
    before = snapshot(run)
    text = one_line_error(resume(run))
    assert not marker.exists()
    assert "refusing to load" in text or "cannot read" in text
    assert snapshot(run) == before


def test_a_crafted_state_does_not_execute_on_replay(run: Path, tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    crafted = tmp_path / "crafted"
    shutil.copytree(run / "checkpoints" / "last", crafted)
    plant(crafted, marker, as_torch_file=True)
    text = one_line_error(runner.invoke(app, ["replay", str(run), "--step", "2", "--checkpoint", str(crafted)]))
    assert not marker.exists() and "refusing to load" in text
    plant(run / "checkpoints" / "last", marker, as_torch_file=True)  # found by itself, as the state after step 2
    result = runner.invoke(app, ["replay", str(run), "--step", "1"])
    assert not marker.exists() and "Traceback" not in result.output


# ---- writes the disk refuses ------------------------------------------------------------------------------


def test_a_full_disk_mid_run_says_what_was_kept_and_the_run_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    saves: list[int] = []
    real_save = torch.save

    def save(obj: object, f: object, *args: object, **kwargs: object) -> None:
        if isinstance(obj, dict) and obj.get("phase") == "rl":
            saves.append(obj["step"])
            if obj["step"] == 2:  # the checkpoint after RL step 2 does not fit on the disk
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_save(obj, f, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(checkpoint_module.torch, "save", save)
    run = tmp_path / "full"
    text = one_line_error(runner.invoke(app, ["train", *TINY, f"output_dir={tmp_path}", "run_name=full"]), code=1)
    assert "No space left on device" in text
    assert "holds rl step 1 and the rows up to it are kept" in text and f"--resume {run}" in text
    monkeypatch.setattr(checkpoint_module.torch, "save", real_save)
    result = resume(run)
    assert result.exit_code == 0, result.output
    assert "resuming after rl step 1" in " ".join(result.output.split())


def test_a_full_disk_on_a_metrics_row_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from harmonyrl.telemetry.metrics import JsonlWriter

    real_write = JsonlWriter.write

    def write(self: JsonlWriter, step: int, metrics: dict[str, float], phase: str) -> None:
        if phase == "rl":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_write(self, step, metrics, phase)

    monkeypatch.setattr(JsonlWriter, "write", write)
    text = one_line_error(runner.invoke(app, ["train", *TINY, f"output_dir={tmp_path}", "run_name=r"]), code=1)
    assert "No space left on device" in text and "no resumable checkpoint" in text


def test_a_read_only_output_folder_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(config: object) -> Path:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(tmp_path / "r"))

    monkeypatch.setattr(loop_module, "open_run", lambda config, *_: refuse(config))
    text = one_line_error(runner.invoke(app, ["train", *TINY, f"output_dir={tmp_path}", "run_name=r"]))
    assert f"cannot write '{tmp_path / 'r'}': Read-only file system" in text


# ---- config files and data the user points at ----------------------------------------------------------


def test_a_config_file_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "run.yaml"
    bad.write_bytes(b"rl:\n  lr: 1e-4 # caf\xe9\n")
    text = one_line_error(runner.invoke(app, ["train", "--config", str(bad)]))
    assert f"config file '{bad}' is not UTF-8 text" in text


def test_a_config_path_that_is_a_directory_is_one_line(tmp_path: Path) -> None:
    text = one_line_error(runner.invoke(app, ["train", "--config", str(tmp_path)]))
    assert f"config file '{tmp_path}' is a directory" in text and "does not exist" not in text


def test_an_empty_held_out_split_is_an_error_not_zero_percent(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    rows = [{"id": f"m{i}", "prompt": f"How many rows are in t{i}?", "answer": "1", "split": "train"} for i in range(3)]
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["train", *TINY, "sft.steps=0", "env.name=sql", f"env.tasks_file={tasks}", "env.n_train=3", "env.n_test=1"]
    text = one_line_error(runner.invoke(app, [*args, f"output_dir={tmp_path / 'runs'}", "run_name=r"]))
    assert "has no held-out tasks" in text and "0.0" not in text
    assert not (tmp_path / "runs" / "r").exists()  # refused before the run folder was made


# ---- harness faults and the circuit breaker in a real run ---------------------------------------------


def test_an_engine_exception_in_an_rl_step_stops_the_run_with_one_line_and_a_logged_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from harmonyrl.engine.local.engine import LocalEngine

    in_rl: list[bool] = []
    real_sample, real_generate = collect_module.sample_step, LocalEngine.generate

    def sample_step(*args: object, **kwargs: object) -> object:
        in_rl.append(True)  # the RL loop samples its step here; the held-out eval does not
        return real_sample(*args, **kwargs)  # type: ignore[arg-type]

    async def generate(self: LocalEngine, *args: object, **kwargs: object) -> object:
        if in_rl:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return await real_generate(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(collect_module, "sample_step", sample_step)
    monkeypatch.setattr(LocalEngine, "generate", generate)
    run = tmp_path / "r"
    text = one_line_error(runner.invoke(app, ["train", *TINY, f"output_dir={tmp_path}", "run_name=r"]), code=1)
    assert "the run stopped on an unexpected error: RuntimeError: CUDA error" in text
    assert f"traceback in '{run / 'error.log'}'" in text
    log = (run / "error.log").read_text()
    assert "Traceback" in log and "illegal memory access" in log and "in the episode of task" in log
    rows = [json.loads(r) for r in (run / "metrics.jsonl").read_text().splitlines()]
    assert not [r for r in rows if r["phase"] == "rl"]  # the step failed: nothing masked, nothing recorded


def test_a_server_gone_past_its_wait_stops_the_run_with_one_line_and_a_resumable_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A vLLM server that stayed down past ``rollout.engine.restart_wait_s`` (here: the embedded engine's generate
    raising the client's failure in RL step 2) is the operator's to bring back, not an unexpected error."""
    from harmonyrl.engine.local.engine import LocalEngine
    from harmonyrl.engine.vllm import EngineFailure

    steps: list[int] = []
    real_sample, real_generate = collect_module.sample_step, LocalEngine.generate

    def sample_step(*args: object, **kwargs: object) -> object:
        steps.append(1)
        return real_sample(*args, **kwargs)  # type: ignore[arg-type]

    async def generate(self: LocalEngine, *args: object, **kwargs: object) -> object:
        if len(steps) == 2:
            raise EngineFailure("vLLM server http://x did not answer /inference/v1/generate for 120.0 s")
        return await real_generate(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(collect_module, "sample_step", sample_step)
    monkeypatch.setattr(LocalEngine, "generate", generate)
    run = tmp_path / "r"
    text = one_line_error(runner.invoke(app, ["train", *TINY, f"output_dir={tmp_path}", "run_name=r"]), code=1)
    assert "did not answer /inference/v1/generate for 120.0 s" in text and "unexpected" not in text
    assert (
        f"holds rl step 1 and the rows up to it are kept (bring the server back, then: harmonyrl train --resume {run})"
        in text
    )
    assert "Traceback" in (run / "error.log").read_text()
    monkeypatch.setattr(LocalEngine, "generate", real_generate)
    result = resume(run)
    assert result.exit_code == 0, result.output
    assert "resuming after rl step 1" in " ".join(result.output.split())


class BrokenFactory:
    """Every environment fails to start: the database behind it is gone."""

    def __init__(self, inner: object) -> None:
        self.inner = inner
        self.name = "calculator"

    def tasks(self, split: str) -> object:
        return self.inner.tasks(split)  # type: ignore[attr-defined]

    def make(self, task: object) -> object:
        raise ConnectionError("database at db:5432 refused the connection")


def test_the_breaker_stops_a_run_whose_env_faults_every_episode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(collect_module, "with_faults", lambda factory, faults, step: BrokenFactory(factory))
    args = [*TINY, "rl.steps=5", "rollout.fault_breaker.consecutive_steps=2", f"output_dir={tmp_path}", "run_name=r"]
    text = one_line_error(runner.invoke(app, ["train", *args]), code=1)
    assert "more than 50% of the episodes faulted in each of the last 2 RL steps (100%, 100%)" in text
    assert "dominant failure: env_error (8 of 8 faults" in text and "ConnectionError" in text
    rows = [json.loads(r) for r in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["phase"] == "rl"] == [1, 2]  # stopped after step 2 of 5
