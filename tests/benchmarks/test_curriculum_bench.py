"""`benchmarks/curriculum.py` on fake run folders: finished runs are reused, and the RESULT line averages the
seeds (final and best pass@1; minutes to the target only when every seed reached it)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from benchmark_module import load_benchmark

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "curriculum.py"


bench = load_benchmark("curriculum")


def fake_run(folder: Path, curve: list[float], step_s: float = 6.0, config: str = "a: 1\n") -> None:
    """A finished RL run evaluated every 10 steps: ``curve[i]`` is pass@1 at step 10·i, each step ``step_s``."""
    folder.mkdir(parents=True)
    rows = [
        {"phase": "rl", "step": s, "time/step_s": step_s, "rollout/episodes": 64} for s in range(1, 10 * len(curve) - 9)
    ]
    rows += [{"phase": "eval", "step": 10 * i, "eval/success": v} for i, v in enumerate(curve)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "summary.json").write_text("{}")
    (folder / "config.yaml").write_text(config)


@pytest.fixture
def same_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every run the benchmark resolves has the config ``a: 1`` (the fake runs' unless told otherwise)."""
    monkeypatch.setattr(bench, "load_config", lambda *_: None)
    monkeypatch.setattr(bench, "dump_config", lambda _: "a: 1\n")


def test_finished_runs_are_reused_and_the_seeds_averaged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], same_config: None
) -> None:
    fake_run(tmp_path / "seed0" / "plain", [0.10, 0.12, 0.11])
    fake_run(tmp_path / "seed1" / "plain", [0.20, 0.16, 0.14])
    fake_run(tmp_path / "seed0" / "curriculum", [0.10, 0.15, 0.20])
    fake_run(tmp_path / "seed1" / "curriculum", [0.20, 0.18, 0.24])

    def never(*_: object, **__: object) -> None:
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(bench, "train", never)
    argv = ["curriculum.py", "--seeds", "2", "--arms", "curriculum,plain", "--warm", "W", "--target", "0.15"]
    monkeypatch.setattr(sys, "argv", [*argv, "--out", str(tmp_path)])
    bench.main()
    result = capsys.readouterr().out.strip().splitlines()[-1]
    # finals (0.11+0.14)/2, (0.20+0.24)/2; bests (0.12+0.20)/2, (0.20+0.24)/2; minutes to 0.15: plain's seed 0 never
    # reached it (nan); the curriculum's seed 0 at step 10 (10 steps x 6 s = 1 min), seed 1 at step 0 (0 min)
    assert result == (
        "RESULT seeds=2 plain_final=0.125 curriculum_final=0.220 plain_min=nan curriculum_min=0.50 "
        "plain_best=0.160 curriculum_best=0.220"
    )


def test_a_seed_override_or_an_unknown_arm_is_a_one_line_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["curriculum.py", "--warm", "W", "seed=3"])
    with pytest.raises(SystemExit, match="--seeds N, not a seed= override"):
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
