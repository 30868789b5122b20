"""The study of ``harmonyrl sweep`` with a fake trial runner (no training): outputs, failed and pruned trials,
resuming from the SQLite file, interrupted trials; and the real runner's own pieces (metrics tail, failure line)."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import signal
import threading
import time
from pathlib import Path

import optuna
import pytest
import yaml
from rich.console import Console

from harmonyrl.config import load_config
from harmonyrl.sweep import command
from harmonyrl.sweep.runner import (
    MetricsTail,
    Reporter,
    TrialJob,
    TrialOutcome,
    error_line,
    run_train_process,
)
from harmonyrl.sweep.study import STUDY_NAME, open_sweep, term_as_interrupt

SPACE = ["rl.lr=log:1e-5:1e-3", "rollout.group_size=choice:4,8"]
FIXED = ["rl.steps=8", "threads=1"]


def fake_value(params: dict[str, object]) -> float:
    """A made-up objective with its peak at rl.lr = 1e-4: 1 - |log10(lr) + 4| / 2 (1 at 1e-4, 0 at 1e-6/1e-2)."""
    return 1 - abs(math.log10(float(params["rl.lr"])) + 4) / 2  # type: ignore[arg-type]


class FakeRunner:
    """Completes each trial with :func:`fake_value` and records what it was given; fails trials with
    ``rollout.group_size == fail_group``."""

    def __init__(self, fail_group: int | None = None) -> None:
        self.fail_group = fail_group
        self.jobs: list[TrialJob] = []
        self.lock = threading.Lock()

    def __call__(self, job: TrialJob, report: Reporter, stop: threading.Event) -> TrialOutcome:
        with self.lock:
            self.jobs.append(job)
        if job.params["rollout.group_size"] == self.fail_group:
            return TrialOutcome("failed", None, 0.01, "config key 'x': boom")
        return TrialOutcome("complete", fake_value(job.params), 0.02)


def _start(tmp_path: Path, runner: object, trials: int, jobs: int = 1, **kw: object) -> tuple[Path, str]:
    out = io.StringIO()
    folder = tmp_path / "sw"
    command.start(
        Console(file=out, width=200), folder, None, list(kw.get("fixed", FIXED)), list(kw.get("space", SPACE)), None,
        trials, jobs, 0, bool(kw.get("prune", True)), runner=runner,  # type: ignore[arg-type]
    )  # fmt: skip
    return folder, out.getvalue()


def _csv(folder: Path) -> list[dict[str, str]]:
    with (folder / "trials.csv").open() as f:
        return list(csv.DictReader(f))


def test_outputs_of_a_study(tmp_path: Path) -> None:
    runner = FakeRunner()
    folder, printed = _start(tmp_path, runner, trials=5, jobs=2)
    table = _csv(folder)
    assert [r["trial"] for r in table] == ["0", "1", "2", "3", "4"]
    assert {r["state"] for r in table} == {"complete"}
    for r in table:  # the value is the runner's, for the parameters in the row
        assert float(r["value"]) == pytest.approx(fake_value({"rl.lr": r["rl.lr"]}), abs=1e-5)
    top = max(table, key=lambda r: float(r["value"]))
    # best_config.yaml is a config `train -c` accepts, with the best trial's values and the fixed ones
    best = load_config(folder / "best_config.yaml")
    assert best.rl.lr == float(top["rl.lr"]) and best.rollout.group_size == int(top["rollout.group_size"])
    assert best.rl.steps == 8 and best.run_name is None and best.threads == 1
    assert best.eval.every == 0  # the periodic evaluation the sweep added to prune on is the trials' only
    assert (folder / "trials.png").stat().st_size > 1000
    # each trial got its own run folder under the sweep folder and a config for it
    assert sorted(j.run_dir.name for j in runner.jobs) == [f"trial_{i:04d}" for i in range(5)]
    trial_cfg = load_config(runner.jobs[0].config_path)
    assert trial_cfg.output_dir == folder / "trials" and trial_cfg.run_name == runner.jobs[0].run_dir.name
    assert trial_cfg.eval.every == 2  # a quarter of rl.steps=8, so the pruner has something to act on
    # the objective is named; without a terminal the table is plain lines, the best marked
    assert "objective: held-out pass@1 after RL" in printed
    assert f"\n{top['trial']} | complete | " in printed and " *" in printed
    value = float(top["value"])  # the table and the summary line show the best value the same way
    assert f"\n{top['trial']} | complete | {value:.1%} | " in printed and f"after RL {value:.1%}  config" in printed
    assert "added for pruning (not in best_config.yaml): eval.every=2" in printed


def test_failed_trial_is_recorded_not_fatal(tmp_path: Path) -> None:
    folder, printed = _start(tmp_path, FakeRunner(fail_group=4), trials=6)
    table = _csv(folder)
    failed = [r for r in table if r["rollout.group_size"] == "4"]
    assert failed and len(table) == 6  # the sweep ran all its trials
    assert all(r["state"] == "failed" and r["error"] == "config key 'x': boom" and r["value"] == "" for r in failed)
    best = load_config(folder / "best_config.yaml")
    assert best.rollout.group_size == 8  # only complete trials can be the best
    assert "failed in 1 s" in printed and "boom" in printed  # 0.01 min, said in seconds


def test_a_runner_that_raises_is_a_failed_trial(tmp_path: Path) -> None:
    def broken(job: TrialJob, report: Reporter, stop: threading.Event) -> TrialOutcome:
        raise RuntimeError("bug in the runner")

    folder, printed = _start(tmp_path, broken, trials=2)
    assert [r["state"] for r in _csv(folder)] == ["failed", "failed"]
    assert _csv(folder)[0]["error"] == "the trial runner raised RuntimeError: bug in the runner"
    assert "no trial completed: no best config" in printed and not (folder / "best_config.yaml").exists()


def test_pruned_on_intermediate_held_out_success(tmp_path: Path) -> None:
    def runner(job: TrialJob, report: Reporter, stop: threading.Event) -> TrialOutcome:
        # trials 0 and 1 score 0.8 at every evaluation; later ones 0.1, below the median (0.8) of the finished ones
        value = 0.8 if job.number < 2 else 0.1
        for step in (2, 4, 6):
            if report(step, value):
                return TrialOutcome("pruned", value, 0.01)
        return TrialOutcome("complete", value, 0.01)

    folder, _ = _start(tmp_path, runner, trials=4)  # the pruner waits for max(2, 4 // 4) = 2 finished trials
    table = _csv(folder)
    assert [r["state"] for r in table] == ["complete", "complete", "pruned", "pruned"]
    assert table[2]["value"] == "0.1"  # a pruned trial keeps its last reported value
    study = optuna.load_study(study_name=STUDY_NAME, storage=f"sqlite:///{folder / 'study.db'}")
    assert study.trials[2].intermediate_values == {2: 0.1}  # stopped at its first evaluation


def test_no_prune_never_stops_a_trial(tmp_path: Path) -> None:
    def runner(job: TrialJob, report: Reporter, stop: threading.Event) -> TrialOutcome:
        value = 0.8 if job.number < 2 else 0.1
        stopped = any(report(step, value) for step in (2, 4, 6))
        return TrialOutcome("pruned" if stopped else "complete", value, 0.01)

    folder, printed = _start(tmp_path, runner, trials=4, prune=False, fixed=["rl.steps=8"])
    assert [r["state"] for r in _csv(folder)] == ["complete"] * 4
    assert "pruning: off" in printed and "eval.every" not in printed  # eval.every is left as it was (0)


def test_resume_continues_the_sqlite_study(tmp_path: Path) -> None:
    first = FakeRunner()
    folder, _ = _start(tmp_path, first, trials=2)
    spec = yaml.safe_load((folder / "sweep.yaml").read_text())
    assert spec["space"]["rl.lr"] == {"kind": "log", "low": 1e-5, "high": 1e-3}
    more, out = FakeRunner(), io.StringIO()
    command.resume(Console(file=out, width=200), folder, 5, 1, runner=more)
    assert "trials: 2 done, 3 to run" in out.getvalue()
    assert [j.number for j in more.jobs] == [2, 3, 4]  # the study's numbering goes on
    assert len(_csv(folder)) == 5
    # the resumed sampler does not redraw the first sweep's random trials (its seed moved on by 2)
    firsts = {j.params["rl.lr"] for j in first.jobs}
    assert not firsts & {j.params["rl.lr"] for j in more.jobs}
    # asking for no more than are done runs nothing
    again = FakeRunner()
    command.resume(Console(file=io.StringIO()), folder, 5, 1, runner=again)
    assert again.jobs == []


def test_resume_requeues_a_trial_the_killed_sweep_left_running(tmp_path: Path) -> None:
    folder, _ = _start(tmp_path, FakeRunner(), trials=1)
    study = optuna.load_study(study_name=STUDY_NAME, storage=f"sqlite:///{folder / 'study.db'}")
    from harmonyrl.sweep.space import distributions

    left = study.ask(distributions(open_sweep(folder).spec.space))  # as a killed sweep leaves it: running
    runner, out = FakeRunner(), io.StringIO()
    command.resume(Console(file=out, width=200), folder, 2, 1, runner=runner)
    assert "1 interrupted trial(s) queued again" in out.getvalue()
    assert [j.params for j in runner.jobs] == [left.params]  # its parameters run again, first
    table = _csv(folder)
    assert [r["state"] for r in table] == ["complete", "failed", "complete"]
    assert table[1]["error"] == "interrupted: the sweep process ended while it ran"  # and it did not count


def test_ctrl_c_stops_the_running_trials_and_resume_runs_them_again(tmp_path: Path) -> None:
    waited: list[bool] = []

    def runner(job: TrialJob, report: Reporter, stop: threading.Event) -> TrialOutcome:
        if job.number == 1:  # Ctrl-C reaches the sweep while trials 0 and 1 run
            raise KeyboardInterrupt
        waited.append(stop.wait(30))  # trial 0 runs until the sweep says stop
        return TrialOutcome("failed", None, 0.01, "interrupted: the sweep stopped")

    with pytest.raises(command.SweepError, match="sweep stopped: continue it with harmonyrl sweep --resume"):
        _start(tmp_path, runner, trials=4, jobs=2)
    folder = tmp_path / "sw"
    assert waited == [True]  # the running trial was told to stop, not left behind
    table = _csv(folder)
    assert [r["state"] for r in table] == ["failed", "failed"]
    assert {r["error"] for r in table} == {"interrupted: the sweep was stopped"}
    more, out = FakeRunner(), io.StringIO()
    command.resume(Console(file=out, width=200), folder, 4, 1, runner=more)
    assert "trials: 0 done, 4 to run" in out.getvalue()  # interrupted trials do not count
    rerun = [{k: str(v) for k, v in j.params.items()} for j in more.jobs[:2]]
    assert rerun == [{k: r[k] for k in ("rl.lr", "rollout.group_size")} for r in table]  # their values run first


def test_sigterm_stops_a_sweep_as_ctrl_c_does() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt), term_as_interrupt():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises before this ends
    assert signal.getsignal(signal.SIGTERM) == before  # and is removed after


def test_new_sweep_refuses_a_used_folder(tmp_path: Path) -> None:
    folder, _ = _start(tmp_path, FakeRunner(), trials=1)
    with pytest.raises(command.SweepError, match="exists and is not empty: continue it with --resume"):
        _start(tmp_path, FakeRunner(), trials=1)
    assert folder.is_dir()


def test_metrics_tail_reads_each_periodic_evaluation_once(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    tail = MetricsTail(path)
    assert tail.new_evals() == []  # no file yet
    rows = [
        {"step": 0, "phase": "eval", "eval/success": 0.3},  # before RL: not an intermediate value
        {"step": 1, "phase": "rl", "rollout/reward": 0.5},
        {"step": 2, "phase": "rl", "eval/success": 0.4},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 4, "phase": "rl", "eval/su')
    assert tail.new_evals() == [(2, 0.4)]
    with path.open("a") as f:  # the half-written line completes
        f.write('ccess": 0.5}\n{"step": 4, "phase": "eval", "eval/success": 0.6}\n')
    assert tail.new_evals() == [(4, 0.5)]
    assert tail.new_evals() == []


def test_error_line_is_the_runs_own_error(tmp_path: Path) -> None:
    log = tmp_path / "t.log"
    log.write_text("run folder x\nerror: config key 'rl.lr': Input should be greater than 0 (got -1)\n\n")
    assert error_line(log, 2) == f"config key 'rl.lr': Input should be greater than 0 (got -1) (exit 2, log {log})"
    log.write_text("Traceback ...\nRuntimeError: oops\n")
    assert error_line(log, 1) == f"RuntimeError: oops (exit 1, log {log})"
    assert error_line(tmp_path / "none.log", 9) == f"exit 9 (log {tmp_path / 'none.log'})"


def test_real_runner_records_a_train_that_fails(tmp_path: Path) -> None:
    # `harmonyrl train -c` of a config that does not exist fails before any compute: a failed trial, its line kept
    job = TrialJob(0, {}, tmp_path / "missing.yaml", tmp_path / "run", tmp_path / "t.log")
    outcome = run_train_process(job, lambda step, value: False, threading.Event(), poll_s=0.05)
    assert outcome.state == "failed" and outcome.value is None
    assert outcome.error is not None and outcome.error.startswith(f"config file '{job.config_path}' does not exist")


def test_a_preset_is_under_the_base_config_and_kept_for_resume(tmp_path: Path) -> None:
    preset = tmp_path / "p.yaml"
    preset.write_text("# test preset\nrl:\n  steps: 12\n  entropy_coef: 0.01\nseed: 3\n")
    first, out = FakeRunner(), io.StringIO()
    folder = tmp_path / "sw"
    command.start(
        Console(file=out, width=200), folder, None, FIXED, SPACE, None, 2, 1, 0, True, runner=first, preset=preset
    )
    trial = load_config(first.jobs[0].config_path)
    # the preset's values reach the trials; the fixed overrides (rl.steps=8) win over it
    assert (trial.rl.entropy_coef, trial.seed, trial.rl.steps) == (0.01, 3, 8)
    assert trial.eval.every == 2  # pruning's eval.every is a quarter of the resolved rl.steps (8), not the preset's
    assert load_config(folder / "best_config.yaml").rl.entropy_coef == 0.01
    # the sweep keeps its own copy: a resumed sweep runs what the first one ran, even if the preset changed
    preset.write_text("rl:\n  entropy_coef: 0.5\n")
    more = FakeRunner()
    command.resume(Console(file=io.StringIO()), folder, 3, 1, runner=more)
    assert load_config(more.jobs[0].config_path).rl.entropy_coef == 0.01
    assert yaml.safe_load((folder / "sweep.yaml").read_text())["preset"] == "preset.yaml"


def test_trials_are_chosen_on_validation_and_best_config_reports_test(tmp_path: Path) -> None:
    runner = FakeRunner()
    folder, printed = _start(tmp_path, runner, trials=2)
    trial = load_config(runner.jobs[0].config_path)
    assert trial.eval.split == "validation"  # the objective and the pruning read the validation split
    assert load_config(folder / "best_config.yaml").eval.split == "test"  # the chosen config is measured on test
    assert yaml.safe_load((folder / "sweep.yaml").read_text())["split"] == "validation"
    assert "eval/success: 200 validation tasks" in printed
    # --split test opts out; a sweep.yaml written before validation splits existed keeps measuring test on resume
    other = FakeRunner()
    out = tmp_path / "on_test"
    command.start(Console(file=io.StringIO()), out, None, FIXED, SPACE, None, 1, 1, 0, True, runner=other, split="test")
    assert load_config(other.jobs[0].config_path).eval.split == "test"
    spec = yaml.safe_load((folder / "sweep.yaml").read_text())
    del spec["split"]
    (folder / "sweep.yaml").write_text(yaml.safe_dump(spec))
    more = FakeRunner()
    command.resume(Console(file=io.StringIO()), folder, 3, 1, runner=more)
    assert load_config(more.jobs[0].config_path).eval.split == "test"


def test_cli_split_flags(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from harmonyrl.cli import app

    runner = CliRunner()
    for args in (["sweep", "--split", "valid"], ["eval", "--checkpoint", str(tmp_path), "--split", "train"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2 and "'validation'" in result.output, result.output
    resumed = runner.invoke(app, ["sweep", "--resume", str(tmp_path), "--split", "test"])
    assert resumed.exit_code == 2 and "give only --trials and --jobs with it" in resumed.output
