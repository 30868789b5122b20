"""Fuzzed resume: random corruptions of a tiny run's folder, then ``harmonyrl train --resume`` on it.

Property (invariant 7): the resume either works, or refuses with one line naming the problem (a user error: exit
code 2, no traceback) and changes nothing in the folder (every file's bytes compared before and after). One tiny
run is trained per module (:mod:`tiny_run`); each example corrupts its own copy: deletes, truncates, garbles or
appends junk to one to three of its files, or makes it look killed before its final checkpoint (no ``summary.json``,
no ``checkpoints/final``) first. Few examples, since each is a resume (model load, evaluation).
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from fuzz_settings import fuzz
from harmonyrl.cli import app
from tiny_run import snapshot, tiny_run

runner = CliRunner()
TINY = tiny_run("rl.steps=2", "eval.n_tasks=2", "eval.samples_per_task=1", "rollout.max_new_tokens=16", "threads=1")


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("runs")
    result = runner.invoke(app, ["train", *TINY, f"output_dir={out}", "run_name=done"])
    assert result.exit_code == 0, result.output
    return out / "done"


@dataclass(frozen=True)
class Corruption:
    file: int
    """Index into the folder's files, sorted (modulo their number)."""
    how: str
    at: float
    """Where in the file, as a fraction of its length."""
    junk: bytes

    def apply(self, run: Path) -> str:
        files = sorted(p for p in run.rglob("*") if p.is_file())
        if not files:
            return "nothing left to corrupt"
        path = files[self.file % len(files)]
        data = path.read_bytes()
        cut = int(len(data) * self.at)
        if self.how == "delete":
            path.unlink()
        elif self.how == "truncate":
            path.write_bytes(data[:cut])
        elif self.how == "garble":
            path.write_bytes(data[:cut] + self.junk + data[cut + len(self.junk) :])
        else:
            path.write_bytes(data + self.junk)
        return f"{self.how} {path.relative_to(run)} at {cut} with {self.junk[:16]!r}"


_corruption = st.builds(
    Corruption,
    file=st.integers(0, 1000),
    how=st.sampled_from(["delete", "truncate", "garble", "append"]),
    at=st.floats(0, 1),
    junk=st.binary(min_size=1, max_size=64) | st.sampled_from([b"\n", b'{"step": 99}\n', b"\xff\xfe", b"\x00" * 8]),
)


def _as_killed(run: Path) -> None:
    """What a run killed after its last RL step and before its final checkpoint leaves behind."""
    (run / "summary.json").unlink()
    shutil.rmtree(run / "checkpoints" / "final")


@fuzz(12, shrink=False)
@given(killed=st.booleans(), corruptions=st.lists(_corruption, min_size=1, max_size=3))
def test_a_corrupted_run_folder_resumes_or_refuses_in_one_line_changing_nothing(
    finished_run: Path, killed: bool, corruptions: list[Corruption]
) -> None:
    """12 examples (~1 s each: most refusals are quick, a resume that works re-runs the final evaluation)."""
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        shutil.copytree(finished_run, run)
        if killed:
            _as_killed(run)
        done = [c.apply(run) for c in corruptions]
        before = snapshot(run)
        result = runner.invoke(app, ["train", "--resume", str(run)])
        if result.exit_code == 0:
            assert (run / "summary.json").is_file(), (done, result.output)
            return
        lines = result.output.strip().splitlines()
        assert result.exit_code == 2 and "Traceback" not in result.output, (done, result.output)
        assert lines[-1].startswith("error: ") and "unexpected error" not in result.output, (done, result.output)
        after = snapshot(run)
        changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        assert not changed, (done, lines[-1], changed)


@pytest.mark.parametrize("damage", ["truncate_config", "delete_folder", "garble_weights"])
def test_a_damaged_rl_start_refuses_before_anything_is_rewound(finished_run: Path, damage: str) -> None:
    """The fuzzer's find: ``checkpoints/sft`` (read as the reference when RL resumes) was read only after the folder
    had been rewound, so a damaged one changed the folder; and a deleted one made RL's reference a fresh model."""
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        shutil.copytree(finished_run, run)
        _as_killed(run)
        sft = run / "checkpoints" / "sft"
        if damage == "truncate_config":
            (sft / "config.json").write_bytes(b"")
        elif damage == "delete_folder":
            shutil.rmtree(sft)
        else:
            weights = sft / "model.safetensors"
            weights.write_bytes(weights.read_bytes()[:100])
        before = snapshot(run)
        result = runner.invoke(app, ["train", "--resume", str(run)])
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output
        assert result.output.strip().splitlines()[-1].startswith("error: ") and "checkpoints/sft" in result.output
        assert snapshot(run) == before
