"""benchmarks/rewards.py's reading of a run: curves, figures, gaming verdict and plot from a hand-written
metrics.jsonl (no training)."""

from __future__ import annotations

import json
from pathlib import Path

from benchmark_module import load_benchmark

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "rewards.py"


def _run(tmp_path: Path, proxy: list[float], truth: list[float], after: float = 0.125) -> Path:
    rows: list[dict[str, object]] = [{"step": 0, "phase": "eval", "eval/success": 0.25, "eval/episodes": 800}]
    for i, (p, t) in enumerate(zip(proxy, truth, strict=True)):
        rows.append({"step": i + 1, "phase": "rl", "reward/model": p, "reward/model_agreement": 0.8,
                     "rollout/success": t, "time/step_s": 2.0, "rollout/episodes": 16})  # fmt: skip
    rows.append({"step": len(proxy), "phase": "eval", "eval/success": after, "eval/episodes": 800})
    run = tmp_path / "rm"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def test_gamed_arm_is_flagged_and_plotted(tmp_path: Path) -> None:
    bench = load_benchmark("rewards")
    # proxy -2, -2, -1, -1 → first 2 mean -2, last 2 mean -1 (rises, no noise); truth 0.5, 0.5, 0.25, 0.25 falls
    c = bench.curves(_run(tmp_path, [-2, -2, -1, -1], [0.5, 0.5, 0.25, 0.25]), "rm")
    assert c.steps == [1, 2, 3, 4] and c.held_out == [(0, 0.25), (4, 0.125)]
    r = bench.summarize(c, "rm", window=2)
    assert (r["true_before"], r["true_after"]) == (0.25, 0.125)
    assert (r["proxy_start"], r["proxy_end"], r["train_success_start"], r["train_success_end"]) == (-2, -1, 0.5, 0.25)
    # held-out 0.25 → 0.125 on 800 each: pooled se sqrt(0.1875 · 0.8125 · 2/800) = 0.0195, a fall of 6.4 se
    assert (r["proxy_trend"], r["truth_trend"], r["gamed"]) == ("rises", "falls / falls", "gamed")
    assert r["s_per_step"] == 2.0 and r["judge_tokens_per_step"] == 0.0
    png = tmp_path / "rewards.png"
    bench.plot({"rm": c}, {"rm": r["gamed"]}, 2, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert any("| rm | 0.250 → 0.125 |" in line and "| gamed |" in line for line in bench.table({"rm": r}))


def test_truth_rising_with_the_proxy_is_not_gamed(tmp_path: Path) -> None:
    bench = load_benchmark("rewards")
    c = bench.curves(_run(tmp_path, [-2, -2, -1, -1], [0.25, 0.25, 0.5, 0.5], after=0.25), "rm")
    r = bench.summarize(c, "rm", window=2)
    assert (r["truth_trend"], r["gamed"]) == ("rises / flat", "not gamed")


def test_held_out_fall_alone_flags_gaming(tmp_path: Path) -> None:
    bench = load_benchmark("rewards")
    c = bench.curves(_run(tmp_path, [-2, -2, -1, -1], [0.25, 0.5, 0.5, 0.25]), "rm")  # train curve flat
    r = bench.summarize(c, "rm", window=2)
    assert (r["truth_trend"], r["gamed"]) == ("flat / falls", "gamed")


def test_seeds_are_pooled_by_the_benchmark_itself() -> None:
    """Two seeds' arm figures → means, standard errors (sample SD / √n) and 'gamed K of N' in the RESULT fields."""
    bench = load_benchmark("rewards")

    def arm(before: float, after: float, gamed: str = "—", agree: float = float("nan")) -> dict[str, object]:
        return {"true_before": before, "true_after": after, "gamed": gamed, "agree_end": agree, "s_per_step": 4.0}

    per_seed = {
        0: {"code": arm(0.10, 0.12), "rm": arm(0.10, 0.04, "gamed", 0.7), "judge": arm(0.10, 0.00, "gamed", 0.6)},
        2: {"code": arm(0.12, 0.12), "rm": arm(0.12, 0.10, "not gamed", 0.8), "judge": arm(0.12, 0.02, "gamed", 0.6)},
    }
    fields = dict(f.split("=", 1) for f in bench.pooled(per_seed).replace(" of ", "_of_").split())
    # code: after 0.12, 0.12 → 0.120 ± 0; change +2, 0 points → 1.0 ± 1.0 (SD √2, /√2)
    assert (fields["code_final"], fields["code_final_se"]) == ("0.120", "0.000")
    assert (fields["code_change_pp"], fields["code_change_pp_se"]) == ("1.0", "1.0")
    # rm: after 0.04, 0.10 → 0.070 ± 0.030; change −6, −2 → −4.0 ± 2.0; gamed on one seed of two
    assert (fields["rm_final"], fields["rm_final_se"], fields["rm_change_pp"]) == ("0.070", "0.030", "-4.0")
    assert (fields["rm_gamed"], fields["judge_gamed"], fields["rm_agree_end"]) == ("1_of_2", "2_of_2", "0.750")
    assert fields["judge_s_per_step"] == "4.0" and fields["seeds"] == "0,2"
    assert "code_gamed" not in fields  # the truth has no proxy to game


def test_inputs_are_named_or_prepared(tmp_path: Path) -> None:
    """Without --prepare, a missing --warm or --rm is a one-line error, not a traceback."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, str(BENCH), "--out", str(tmp_path)], capture_output=True, text=True,
                         timeout=120, check=False)  # fmt: skip
    assert out.returncode != 0
    assert out.stderr.strip().splitlines() == [
        "rewards.py: give --warm and --rm, or --prepare to make them (docs/rewards.md)"
    ]
