"""``benchmarks/retrospective.py`` over seeds: every arm runs each seed from the one warm start, in its own folder
(seed 0 keeps the folder it had before seeds existed), and the report pools the seeds with SEs and paired
differences to (a), computed as stated."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from benchmark_module import load_benchmark

retro = load_benchmark("retrospective")


def summary(final: float, kl: float = 0.5, grad: float = 2.0) -> dict[str, float]:
    return {"before": 0.2, "final": final, "kl": kl, "grad": grad, "ess": 1.0, "dev": 0.0, "reward_last5": 0.0}


def test_the_result_line_pools_the_seeds_and_pairs_each_arm_with_a() -> None:
    runs = {
        "a": [summary(0.20, kl=0.6, grad=5.0), summary(0.30, kl=0.4, grad=3.0)],
        "d": [summary(0.35, kl=1e-13, grad=1.0), summary(0.41, kl=3e-13, grad=2.0)],
    }
    # a: (0.20+0.30)/2 = 0.25, SE |0.1|/2 = 0.05; d: 0.38 ± 0.03; d − a per seed +15, +11 pp -> +13.0 ± 2.0;
    # grad and KL: means over seeds
    assert retro.result_line(runs, 0.64) == (
        "RESULT seeds=2 a_final=0.250 a_final_se=0.050 d_final=0.380 d_final_se=0.030 d_vs_a_pp=13.0 "
        "d_vs_a_se=2.0 a_maxgrad=4.00 d_maxgrad=1.50 a_kl=5.000e-01 d_kl=2.000e-13 sink_mass=0.640"
    )


def test_one_seed_has_no_standard_error() -> None:
    line = retro.result_line({"a": [summary(0.2)], "d": [summary(0.3)]}, 0.5)
    assert "a_final_se=nan" in line and "d_vs_a_pp=10.0 d_vs_a_se=nan" in line


def test_the_seeds_table_gives_each_arm_per_seed_mean_and_the_paired_gap() -> None:
    rows = retro.seeds_table({"a": [0.2, 0.3], "d": [0.35, 0.41]}, {"a": "sink-less", "d": "matched"})
    assert rows[2] == "| (a) sink-less | 20.0%, 30.0% | 25.0 % ± 5.0 | — |"
    assert rows[3] == "| (d) matched | 35.0%, 41.0% | 38.0 % ± 3.0 | +13.0 ± 2.0 |"


def test_each_seed_runs_in_its_own_folder_with_its_seed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loaded: list[list[str]] = []

    def fake_load(_: object, overrides: list[str]) -> list[str]:
        loaded.append(overrides)
        return overrides

    class Done:
        def __init__(self, cfg: list[str]) -> None:
            self.run_dir = tmp_path / next(o for o in cfg if o.startswith("run_name=")).split("=", 1)[1]

    async def fake_train(cfg: list[str], _: object) -> Done:
        return Done(cfg)

    monkeypatch.setattr(retro, "load_config", fake_load)
    monkeypatch.setattr(retro, "train", fake_train)
    base = [f"output_dir={tmp_path}", "rl.steps=2"]
    assert retro.run_arm("a_5", ["x=1"], Path("W"), base, None, seed=0) == tmp_path / "a_5"
    assert retro.run_arm("a_5", ["x=1"], Path("W"), base, None, seed=2) == tmp_path / "a_5_seed2"
    assert loaded[0][-1] == "seed=0" and loaded[1][-1] == "seed=2" and "run_name=a_5_seed2" in loaded[1]
    (tmp_path / "a_5_seed2").mkdir()
    (tmp_path / "a_5_seed2" / "summary.json").write_text("{}")

    class Quiet:
        def print(self, *_: object) -> None: ...

    assert retro.run_arm("a_5", [], Path("W"), base, Quiet(), seed=2) == tmp_path / "a_5_seed2"
    assert len(loaded) == 2  # a finished seed is reused, not trained again


def test_a_seed_override_or_no_seed_is_a_one_line_error(monkeypatch: pytest.MonkeyPatch) -> None:
    for argv in (["--seeds", "0"], ["seed=3"]):
        monkeypatch.setattr(sys, "argv", ["retrospective.py", *argv])
        with pytest.raises(SystemExit) as e:
            retro.main()
        assert e.value.code == 2
