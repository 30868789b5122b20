"""`benchmarks/envs.py` on fake run folders: which env learned, the table, the RESULT line, resuming, and the
presets it runs (one per built-in env, each a valid run config for that env)."""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

import pytest

from benchmark_module import load_benchmark
from harmonyrl.config import load_config
from harmonyrl.harmony.codecs import load_codec
from harmonyrl.harmony.render import render_completion
from harmonyrl.tasks.config import EXTERNAL_ENVS, EnvConfig
from harmonyrl.tasks.factory import expert_for, make_factory

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "envs.py"


bench = load_benchmark("envs")


def fake_run(
    out: Path,
    env: str,
    before: float,
    after: float,
    minutes: float = 2.5,
    se: tuple[float, ...] | None = None,
    test: tuple[float, float, float, float] | None = None,
    tools: tuple[float, float] | None = None,
) -> None:
    """A finished run folder: validation figures ``before → after`` (greedy 50 → 75 %), with ``se`` (pass@1 before,
    after, greedy before, after) its two evaluations; with ``test`` (pass@1 before, after, their SEs; greedy 40 →
    60 % ± 5) the two test evaluations, and ``tools`` their tool-call rates."""
    (out / env).mkdir(parents=True)
    summary = {"success_before": before, "success_after": after, "greedy_success_before": 0.5,
               "greedy_success_after": 0.75, "minutes": minutes}  # fmt: skip
    (out / env / "summary.json").write_text(json.dumps(summary))
    if se is not None:
        evals = [{"phase": "eval", "step": step, "eval/success_se": se[i], "eval_greedy/success_se": se[i + 2]}
                 for i, step in enumerate((0, 10))]  # fmt: skip
        (out / env / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in evals))
    if test is not None:
        for i, (record, greedy) in enumerate(zip(bench.test_records(out, env), (0.4, 0.6), strict=True)):
            metrics = {"eval/success": test[i], "eval/success_se": test[2 + i], "eval_greedy/success": greedy,
                       "eval_greedy/success_se": 0.05}  # fmt: skip
            if tools is not None:
                metrics["eval/tool_call_rate"] = tools[i]
            record.write_text(json.dumps({"checkpoint": "x", "split": "test", "metrics": metrics}))


def test_every_built_in_env_has_a_preset_for_itself() -> None:
    names = {member.model_fields["name"].default for member in EnvConfig.__args__[0].__args__}  # type: ignore[attr-defined]
    # relay, a team env: benchmarks/multiagent.py; the external ecosystems: benchmarks/external.py
    assert set(bench.ENVS) == names - {"custom", "relay", *EXTERNAL_ENVS}
    for env in bench.ENVS:
        assert load_config(bench.PRESETS / f"{env}.yaml", []).env.name == env


@pytest.mark.parametrize("env", bench.ENVS)
def test_every_preset_lets_its_expert_finish_a_turn(env: str) -> None:
    # A message longer than rollout.max_new_tokens cannot be sampled whole: the task is lost before the policy acts
    # (the sql preset's 128 cut the expert's query on 12 of 50 held-out questions). Checked on the held-out tasks.
    cfg = load_config(bench.PRESETS / f"{env}.yaml", [])
    codec, factory, expert = load_codec(cfg.model.tokenizer), make_factory(cfg.env, cfg.seed), expert_for(cfg.env)
    tasks = list(factory.tasks("test"))[: cfg.eval.n_tasks]
    longest = max(len(render_completion(codec, [m])) for i, t in enumerate(tasks)
                  for m in expert(t, random.Random(i)) if m.role == "assistant")  # fmt: skip
    assert longest <= cfg.rollout.max_new_tokens, f"{env}: an expert message of {longest} tokens"


def test_learned_means_more_than_ten_points_and_two_standard_errors_on_test(tmp_path: Path) -> None:
    fake_run(tmp_path, "calculator", 0.2, 0.35, se=(0.02,) * 4, test=(0.20, 0.35, 0.02, 0.02))  # +15 pp, SE 2.8
    fake_run(tmp_path, "retool", 0.2, 0.35, se=(0.02,) * 4, test=(0.20, 0.35, 0.06, 0.06))  # +15 but 2 SE is 17
    fake_run(tmp_path, "sql", 0.2, 0.35, se=(0.02,) * 4, test=(0.20, 0.30, 0.001, 0.001))  # exactly +10: not more
    fake_run(tmp_path, "instruct", 0.2, 0.5)  # trained, not yet evaluated on test: no test figures
    fake_run(tmp_path, "browse", 0.2, 0.25, se=(0.02,) * 4, test=(0.1, 0.4, 0.02, 0.02))  # learned; fails validation
    envs = ("calculator", "retool", "sql", "instruct", "maze", "browse")
    rows = [bench.read_row(e, bench.PRESETS / f"{e}.yaml", tmp_path, "not run (budget)") for e in envs]
    assert [r.learned for r in rows] == [True, False, False, False, False, True]
    assert [r.passed_validation for r in rows] == [True, True, True, True, False, False]
    gain = rows[0].test.gain() if rows[0].test else None
    assert gain is not None and gain.mean == pytest.approx(0.15) and gain.se == pytest.approx(0.02 * 2**0.5)
    n = load_config(bench.PRESETS / "instruct.yaml", []).eval.n_tasks
    val = rows[3].validation  # no SE recorded: the largest the task count allows
    assert val is not None and val.se_bound and rows[3].test is None
    assert val.se[:2] == pytest.approx(((0.16 / (n - 1)) ** 0.5, (0.25 / (n - 1)) ** 0.5))  # p = 0.2, then 0.5
    assert rows[3].status == "trained; not yet evaluated on test"
    assert rows[4].status == "not run (budget)" and rows[4].validation is None
    assert bench.result_line(rows) == (
        "RESULT envs=calculator,retool,sql,instruct,maze,browse learned=2 of 6 rule=gain>10pp&>2SE split=test "
        "chosen_on=validation passed_validation=4 of 6"
    )


def test_table_has_one_row_per_env_with_figures_or_the_reason(tmp_path: Path) -> None:
    fake_run(tmp_path, "calculator", 0.25, 0.5, 3.04, (0.03, 0.04, 0.05, 0.05), (0.3, 0.6, 0.04, 0.05), (0.5, 0.9))
    (tmp_path / "calculator.bench.json").write_text(json.dumps({"load": "2.0 → 3.0"}))
    rows = [bench.read_row("calculator", bench.PRESETS / "calculator.yaml", tmp_path, "x"),
            bench.read_row("maze", bench.PRESETS / "maze.yaml", tmp_path, "not run (budget)")]  # fmt: skip
    lines = bench.table(rows)
    assert len(lines) == 2 + 2
    calc = lines[2].split(" | ")
    assert calc[:12] == ["| calculator", "25.0% → 50.0%", "+25.0 ± 5.0", "yes", "30.0% → 60.0%", "+30.0 ± 6.4",
                         "40.0% → 60.0%", "+20.0 ± 7.1", "**yes**", "3.0", "2.0 → 3.0", "50.0% → 90.0%"]  # fmt: skip
    maze_budget = bench.budget_of(load_config(bench.PRESETS / "maze.yaml", []))
    assert maze_budget.startswith("micro; SFT ") and "; RL " in maze_budget
    assert lines[3] == f"| maze | — | — | — | not run (budget) | — | — | — | no | — | — | — | {maze_budget} |"


def test_tool_call_rates_are_the_test_evaluations_and_only_for_envs_with_tools(tmp_path: Path) -> None:
    fake_run(tmp_path, "sql", 0.1, 0.2, test=(0.1, 0.2, 0.01, 0.01), tools=(0.49, 0.04))
    assert bench.read_row("sql", bench.PRESETS / "sql.yaml", tmp_path, "x").tool_calls == (0.49, 0.04)
    fake_run(tmp_path, "retool", 0.1, 0.2, test=(0.1, 0.2, 0.01, 0.01))  # evaluations without the rate: no pair
    assert bench.read_row("retool", bench.PRESETS / "retool.yaml", tmp_path, "x").tool_calls is None
    fake_run(tmp_path, "instruct", 0.1, 0.2, test=(0.1, 0.2, 0.01, 0.01), tools=(0.0, 0.0))  # no tools: no signal
    assert bench.read_row("instruct", bench.PRESETS / "instruct.yaml", tmp_path, "x").tool_calls is None


def test_plot_is_written_with_a_missing_env(tmp_path: Path) -> None:
    fake_run(tmp_path, "sql", 0.1, 0.4, test=(0.1, 0.4, 0.01, 0.01))
    rows = [bench.read_row(e, bench.PRESETS / f"{e}.yaml", tmp_path, "not run (budget)") for e in ("sql", "browse")]
    bench.plot(rows, tmp_path / "envs.png")
    assert (tmp_path / "envs.png").stat().st_size > 1000


def test_envs_are_run_in_the_benchmark_order_and_unknown_names_are_one_line_errors() -> None:
    assert bench.parse_envs("maze, sql") == ["sql", "maze"]
    with pytest.raises(SystemExit, match="unknown env mase; choose from calculator,"):
        bench.parse_envs("sql,mase")


def _no_subprocess(*args: object, **kwargs: object) -> None:
    raise AssertionError("a finished run must be reused, not run again")


def test_a_finished_run_is_reused_and_a_changed_preset_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    preset = tmp_path / "sql.yaml"
    preset.write_text((bench.PRESETS / "sql.yaml").read_text())
    out = tmp_path / "out"
    fake_run(out, "sql", 0.1, 0.4, test=(0.1, 0.4, 0.01, 0.01))
    (out / "sql.preset.yaml").write_text(preset.read_text())
    monkeypatch.setattr(subprocess, "run", _no_subprocess)
    assert bench.run_env("sql", preset, out, None) == "done"
    preset.write_text(preset.read_text() + "\n# a comment changes nothing the run did\n")
    assert bench.run_env("sql", preset, out, None) == "done"
    assert (out / "sql.preset.yaml").read_text() == preset.read_text()
    preset.write_text(preset.read_text().replace("n_tasks: 50", "n_tasks: 40"))
    with pytest.raises(SystemExit, match="changed since the run"):
        bench.run_env("sql", preset, out, None)


def test_a_run_of_an_older_preset_shows_no_figures_beside_the_new_budget(tmp_path: Path) -> None:
    preset = tmp_path / "sql.yaml"
    preset.write_text((bench.PRESETS / "sql.yaml").read_text())
    out = tmp_path / "out"
    fake_run(out, "sql", 0.1, 0.4, test=(0.1, 0.45, 0.01, 0.01))
    (out / "sql.preset.yaml").write_text(preset.read_text())
    test = bench.read_row("sql", preset, out, "not run (budget)").test
    assert test is not None and test.after == 0.45
    preset.write_text(preset.read_text().replace("steps: 60", "steps: 70"))
    row = bench.read_row("sql", preset, out, "not run (budget)")
    assert row.test is None and row.validation is None and row.status.startswith("ran an older preset")
    assert "RL 70×" in row.budget and not row.learned


def test_a_stopped_run_is_resumed_with_its_own_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"
    (out / "maze").mkdir(parents=True)
    (out / "maze" / "config.yaml").write_text("seed: 0\neval:\n  split: validation\n")
    calls: list[list[str]] = []

    def fake(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 1)

    monkeypatch.setattr(subprocess, "run", fake)
    assert bench.run_env("maze", bench.PRESETS / "maze.yaml", out, None) == "failed (exit 1, see maze.log)"
    assert calls == [["harmonyrl", "train", "--resume", str(out / "maze")]]


def test_a_finished_run_has_its_warm_start_and_final_weights_evaluated_once_on_test(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    fake_run(out, "sql", 0.1, 0.4)
    (out / "sql" / "config.yaml").write_text("seed: 0\neval:\n  split: validation\n")
    calls: list[list[str]] = []

    def fake(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        record = Path(cmd[cmd.index("--metrics-out") + 1])
        record.write_text(json.dumps({"metrics": {"eval/success": 0.5}}))
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(subprocess, "run", fake)
    assert bench.run_env("sql", bench.PRESETS / "sql.yaml", out, None) == "done"
    run = out / "sql"
    assert [c[:4] for c in calls] == [["harmonyrl", "eval", "--checkpoint", str(run / "checkpoints" / name)]
                                      for name in ("sft", "final")]  # fmt: skip
    assert all(c[c.index("--split") + 1] == "test" and c[c.index("-c") + 1] == str(run / "config.yaml") for c in calls)
    monkeypatch.setattr(subprocess, "run", _no_subprocess)  # evaluated once: never again
    assert bench.run_env("sql", bench.PRESETS / "sql.yaml", out, None) == "done"


def test_a_run_that_evaluated_on_test_is_refused(tmp_path: Path) -> None:
    fake_run(tmp_path, "sql", 0.1, 0.4)
    (tmp_path / "sql" / "config.yaml").write_text("seed: 0\neval:\n  split: test\n")  # the protocol before validation
    with pytest.raises(SystemExit, match="evaluated on test, not validation"):
        bench.run_env("sql", bench.PRESETS / "sql.yaml", tmp_path, None)


def test_a_deadline_past_midnight_is_tonights() -> None:
    left = bench.seconds_left("00:00")
    assert left is not None and -12 * 3600 <= left <= 12 * 3600


def test_a_run_an_earlier_invocation_left_unfinished_says_where_it_stopped(tmp_path: Path) -> None:
    run = tmp_path / "maze"
    run.mkdir()
    (run / "config.yaml").write_text("sft:\n  steps: 150\nrl:\n  steps: 12\n")
    rows = [{"step": 5, "phase": "sft", "sft/loss": 6.2}, {"step": 6, "phase": "sft", "sft/loss": 6.0}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    row = bench.read_row("maze", bench.PRESETS / "maze.yaml", tmp_path, "not run (budget)")
    assert row.status == "stopped (budget) at SFT step 7 of 150"  # SFT rows count from 0: 7 steps done
    (run / "metrics.jsonl").write_text(json.dumps({"step": 3, "phase": "rl", "rollout/reward": 0.1}) + "\n")
    assert bench.where_stopped(run) == "stopped (budget) at RL step 3 of 12"
    failed = bench.read_row("maze", bench.PRESETS / "maze.yaml", tmp_path, "failed (exit 1, see maze.log)")
    assert failed.status == "failed (exit 1, see maze.log)"
