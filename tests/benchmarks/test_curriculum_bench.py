"""`benchmarks/curriculum.py` on fake run folders: finished runs and test evaluations are reused; the curves are
validation figures and the report test ones (the warm start and each final checkpoint evaluated once on test); the
RESULT line pools the seeds (test finals with SEs, paired differences to plain; validation minutes to the target
only when every seed reached it)."""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmark_module import load_benchmark

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "curriculum.py"


bench = load_benchmark("curriculum")


def record(path: Path, success: float, split: str = "test") -> None:
    """A ``harmonyrl eval --metrics-out`` record of ``success`` (SE 0.01, greedy ``success + 0.3``)."""
    metrics = {"eval/success": success, "eval/success_se": 0.01, "eval_greedy/success": success + 0.3}
    path.write_text(json.dumps({"checkpoint": "c", "split": split, "metrics": metrics}))


def fake_run(
    folder: Path, curve: list[float], step_s: float = 6.0, config: str = "a: 1\n", test: float | None = None
) -> None:
    """A finished RL run evaluated every 10 steps: ``curve[i]`` is validation pass@1 at step 10·i, each step
    ``step_s``; ``test``: its final weights' test record (absent: not yet evaluated on test)."""
    folder.mkdir(parents=True)
    rows = [
        {"phase": "rl", "step": s, "time/step_s": step_s, "rollout/episodes": 64} for s in range(1, 10 * len(curve) - 9)
    ]
    rows += [{"phase": "eval", "step": 10 * i, "eval/success": v} for i, v in enumerate(curve)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "summary.json").write_text("{}")
    (folder / "config.yaml").write_text(config)
    if test is not None:
        record(folder / "test-final.json", test)


@dataclass
class Resolved:
    """A stand-in for a resolved config: its overrides, and ``eval.split`` (the last one set) as ``cfg.eval.split``."""

    overrides: list[str]

    @property
    def eval(self) -> SimpleNamespace:
        return SimpleNamespace(split=[o for o in self.overrides if o.startswith("eval.split=")][-1].split("=", 1)[1])


@pytest.fixture
def same_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every run the benchmark resolves has the config ``a: 1`` (the fake runs' unless told otherwise)."""
    monkeypatch.setattr(bench, "load_config", lambda *_: None)
    monkeypatch.setattr(bench, "dump_config", lambda _: "a: 1\n")


def test_finished_runs_are_reused_and_the_seeds_averaged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], same_config: None
) -> None:
    fake_run(tmp_path / "seed0" / "plain", [0.10, 0.12, 0.11], test=0.10)
    fake_run(tmp_path / "seed1" / "plain", [0.20, 0.16, 0.14], test=0.20)
    fake_run(tmp_path / "seed0" / "curriculum", [0.10, 0.15, 0.20], test=0.16)
    fake_run(tmp_path / "seed1" / "curriculum", [0.20, 0.18, 0.24], test=0.30)
    record(tmp_path / "seed0" / "warm.test.json", 0.05)
    record(tmp_path / "seed1" / "warm.test.json", 0.07)

    def never(*_: object, **__: object) -> None:
        raise AssertionError("a finished run was trained or evaluated again")

    monkeypatch.setattr(bench, "train", never)
    monkeypatch.setattr(bench, "eval_only", never)
    argv = ["curriculum.py", "--seeds", "2", "--arms", "curriculum,plain", "--warm", "W", "--target", "0.15"]
    monkeypatch.setattr(sys, "argv", [*argv, "--out", str(tmp_path)])
    bench.main()
    result = capsys.readouterr().out.strip().splitlines()[-1]
    # test: before (0.05+0.07)/2; plain finals 0.10, 0.20 -> 0.150 ± 0.050 (SE of two: |a-b|/2); curriculum 0.16, 0.30
    # -> 0.230 ± 0.070; paired differences +6, +10 pp -> +8.0 ± 2.0. Validation: plain's seed 0 never reached 0.15
    # (nan); the curriculum's seed 0 at step 10 (10 steps x 6 s = 1 min), seed 1 at step 0 (0 min); bests (0.12+0.20)/2,
    # (0.20+0.24)/2
    assert result == (
        "RESULT seeds=2 split=test curve_split=validation before=0.060 plain_final=0.150 plain_final_se=0.050 "
        "curriculum_final=0.230 curriculum_final_se=0.070 curriculum_vs_plain_pp=8.0 curriculum_vs_plain_se=2.0 "
        "plain_val_min=nan curriculum_val_min=0.50 plain_val_best=0.160 curriculum_val_best=0.220"
    )


def test_each_checkpoint_is_evaluated_once_on_test_with_the_runs_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The runs evaluate on validation; the warm start (once per seed) and the final weights on test, with the
    run's other settings; the records are written and a second invocation measures nothing."""
    fake_run(tmp_path / "seed0" / "plain", [0.10, 0.12])
    fake_run(tmp_path / "seed0" / "curriculum", [0.10, 0.15])
    configs: list[Resolved] = []

    def fake_load(_: object, overrides: list[str]) -> Resolved:
        configs.append(Resolved(overrides))
        return configs[-1]

    monkeypatch.setattr(bench, "load_config", fake_load)
    monkeypatch.setattr(bench, "dump_config", lambda _: "a: 1\n")
    evaluated: list[tuple[str, Path]] = []

    async def fake_eval(cfg: Resolved, checkpoint: Path, _: object) -> dict[str, float]:
        evaluated.append((cfg.eval.split, checkpoint))
        return {"eval/success": 0.3, "eval/success_se": 0.02, "eval_greedy/success": 0.5}

    monkeypatch.setattr(bench, "eval_only", fake_eval)
    argv = ["curriculum.py", "--arms", "plain,curriculum", "--warm", str(tmp_path / "W"), "--out", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", argv)
    bench.main()
    assert [c.eval.split for c in configs] == ["validation", "test"] * 2  # each arm: its run, then its test config
    assert configs[1].overrides[:-1] == configs[0].overrides  # the test config is the run's, eval.split aside
    seed0 = tmp_path / "seed0"
    assert evaluated == [
        ("test", tmp_path / "W"),
        ("test", seed0 / "plain" / "checkpoints" / "final"),
        ("test", seed0 / "curriculum" / "checkpoints" / "final"),
    ]
    saved = json.loads((tmp_path / "seed0" / "plain" / "test-final.json").read_text())
    assert saved["split"] == "test" and saved["metrics"]["eval/success"] == 0.3
    assert "curriculum_vs_plain_pp=0.0" in capsys.readouterr().out
    bench.main()  # everything recorded: nothing is measured again
    assert len(evaluated) == 3


def test_a_record_from_another_split_is_refused(tmp_path: Path) -> None:
    record(tmp_path / "r.json", 0.2, split="validation")
    with pytest.raises(SystemExit, match="is not a test-split evaluation: delete it"):
        bench._test(None, tmp_path, tmp_path / "r.json", None)


def test_a_seed_override_or_an_unknown_arm_is_a_one_line_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["curriculum.py", "--warm", "W", "seed=3"])
    with pytest.raises(SystemExit, match="--seeds N, not a seed= override"):
        bench.main()
    monkeypatch.setattr(sys, "argv", ["curriculum.py", "--warm", "W", "eval.split=test"])
    with pytest.raises(SystemExit, match=r"eval\.split is not set"):
        bench.main()
    monkeypatch.setattr(sys, "argv", ["curriculum.py", "--warm", "W", "--arms", "plain,curricullum"])
    expected = "unknown arm(s) curricullum; choose from plain, dynamic, curriculum"
    with pytest.raises(SystemExit, match=re.escape(expected)):
        bench.main()


def test_a_finished_run_of_other_settings_stops_the_benchmark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, same_config: None
) -> None:
    fake_run(tmp_path / "seed0" / "plain", [0.10, 0.12], config="a: 2\n")  # e.g. an earlier --steps
    monkeypatch.setattr(sys, "argv", ["curriculum.py", "--arms", "plain", "--warm", "W", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="holds a finished run of other settings: delete it or use another --out"):
        bench.main()
