"""`benchmarks/external.py` on fake run folders: its rows are valid run configs of the ecosystem adapters, and the
RESULT line is computed from the runs (learned = held-out gain > +10 points and > 2 SE)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from benchmark_module import load_benchmark
from harmonyrl.config import load_config

pytest.importorskip("reasoning_gym", reason="reasoning-gym is not installed (pip install 'harmonyrl[reasoning-gym]')")
pytest.importorskip("verifiers.v1", reason="verifiers is not installed (pip install 'harmonyrl[verifiers]')")

external = load_benchmark("external")


def fake_run(out: Path, row: str, before: float, after: float, se: float) -> None:
    """A finished row: the same figures on validation (its run) and on test (its two test evaluations)."""
    (out / row).mkdir(parents=True)
    summary = {"success_before": before, "success_after": after, "greedy_success_before": before,
               "greedy_success_after": after, "minutes": 6.5}  # fmt: skip
    (out / row / "summary.json").write_text(json.dumps(summary))
    evals = [{"phase": "eval", "step": s, "eval/success_se": se, "eval_greedy/success_se": se} for s in (0, 60)]
    (out / row / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in evals))
    for record, p in zip(external.bench.test_records(out, row), (before, after), strict=True):
        metrics = {"eval/success": p, "eval/success_se": se, "eval_greedy/success": p, "eval_greedy/success_se": se}
        record.write_text(json.dumps({"split": "test", "metrics": metrics}))


def test_every_row_is_a_run_config_of_an_external_env() -> None:
    for row in external.ROWS:
        env = load_config(external.ROWS_DIR / f"{row}.yaml", []).env
        assert env.name in ("reasoning_gym", "verifiers", "textarena")


def test_the_result_line_counts_the_rows_that_learned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_run(tmp_path, "rg_letter_counting", 0.40, 0.80, se=0.03)  # +40 points, SE 4.2: learned
    fake_run(tmp_path, "rg_syllogism", 0.10, 0.15, se=0.02)  # +5 points: not
    argv = ["external.py", "--table-only", "--out", str(tmp_path)]
    argv += ["--rows", "rg_letter_counting,rg_syllogism"]
    monkeypatch.setattr(sys, "argv", argv)
    external.main()
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == (
        "RESULT envs=rg_letter_counting,rg_syllogism learned=1 of 2 rule=gain>10pp&>2SE split=test "
        "chosen_on=validation passed_validation=1 of 2"
    )
    assert any(line.startswith("| rg_letter_counting | 40.0% → 80.0% | +40.0 ± 4.2 | yes | 40.0% → 80.0% |")
               for line in lines)  # fmt: skip
    assert (tmp_path / "external.md").read_text().splitlines()[0].endswith("constant baseline (test) |")


def test_a_game_without_reference_answers_has_no_constant_baseline() -> None:
    """TextArena tasks carry no reference answer: the "most common answer" baseline would count the empty string
    as right every time (100 %); it is left out ("—") instead."""
    assert external.constant_baseline(external.ROWS_DIR / "ta_tictactoe.yaml", "test") is None
    assert external.constant_baseline(external.ROWS_DIR / "rg_syllogism.yaml", "test") is not None


def test_a_row_against_another_rows_checkpoint_waits_for_it_then_plays_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ran: dict[str, tuple[str, ...]] = {}

    def run_env(row: str, preset: Path, out: Path, left: float | None, overrides: tuple[str, ...] = ()) -> str:
        ran[row] = overrides
        return "done"

    monkeypatch.setattr(external.bench, "run_env", run_env)
    monkeypatch.setattr(sys, "argv", ["external.py", "--out", str(tmp_path), "--rows", "ta_kuhnpoker_vs_ckpt"])
    external.main()
    assert ran == {}  # no ta_kuhnpoker checkpoint in --out: not run, said so in the table
    assert (
        "not run (its opponent is ta_kuhnpoker's final checkpoint: run ta_kuhnpoker first)" in capsys.readouterr().out
    )
    final = tmp_path / "ta_kuhnpoker" / "checkpoints" / "final"
    final.mkdir(parents=True)
    (final / "config.json").write_text("{}")
    external.main()
    assert ran == {"ta_kuhnpoker_vs_ckpt": (f"env.opponent={final}",)}
