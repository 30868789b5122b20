"""The command line: a 2-step train smoke run writes a complete run folder; user mistakes are one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harmonyrl.cli import app
from harmonyrl.engine.local.native import isa
from tiny_run import tiny_run

runner = CliRunner()
TINY = tiny_run()


def test_train_two_steps_writes_run_folder(tmp_path: Path) -> None:
    result = runner.invoke(app, ["train", *TINY, f"output_dir={tmp_path}", "run_name=smoke"])
    assert result.exit_code == 0, result.output
    assert f"engine decode native ({isa()})" in " ".join(result.output.split())  # rich wraps lines
    run = tmp_path / "smoke"
    assert (run / "config.yaml").is_file()
    assert (run / "checkpoints" / "final" / "model.safetensors").is_file()
    assert (run / "checkpoints" / "sft" / "config.json").is_file()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    phases = [r["phase"] for r in rows]
    assert phases.count("sft") == 3 and phases.count("rl") == 2 and phases.count("eval") == 2
    rl = [r for r in rows if r["phase"] == "rl"]
    for key in (
        "rollout/reward",
        "rollout/tool_call_rate",
        "rollout/parse_error_rate",
        "time/rollout_s",
        "rollout/tokens_per_s",
        "rollout/response_tokens",
    ):
        assert key in rl[0], key
    for r in rl:  # every episode starts with the env's system + developer messages: a cached head
        assert 0 < r["engine/prefill_frac"] < r["engine/compute_frac"] < r["engine/busy_frac"] <= 1
        assert r["engine/mean_batch"] >= 1 and 0 <= r["engine/idle_frac"] < 1
        assert 0.3 < r["engine/prefix_reused_frac"] < 1 and r["engine/slot_moves"] >= 0
    evals = [r for r in rows if r["phase"] == "eval"]
    assert all(k in evals[-1] for k in ("eval/pass@1", "eval/pass@2", "eval/pass@4", "eval_greedy/success"))
    episodes = [json.loads(line) for line in (run / "rollouts" / "episodes.jsonl").read_text().splitlines()]
    assert sorted({e["step"] for e in episodes}) == [1, 2] and len(episodes) == 2 * 2 * 2
    report = runner.invoke(app, ["report", str(run)])
    assert report.exit_code == 0, report.output
    assert "Sample episodes" in (run / "report" / "index.html").read_text()
    summary = json.loads((run / "summary.json").read_text())
    assert 0.0 <= summary["success_after"] <= 1.0 and 0.0 <= summary["greedy_success_after"] <= 1.0
    # the final checkpoint is a transformers checkpoint
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(run / "checkpoints" / "final")
    assert model.config.model_type == "gpt_oss"
    # and `harmonyrl eval` reads it
    ev = runner.invoke(
        app,
        [
            "eval",
            "--checkpoint",
            str(run / "checkpoints" / "final"),
            "eval.n_tasks=2",
            "env.n_train=64",
            "env.n_test=8",
            "--metrics-out",
            str(tmp_path / "eval.json"),
        ],
    )
    assert ev.exit_code == 0, ev.output
    assert "eval/success" in ev.output and "eval_greedy/success" in ev.output
    record = json.loads((tmp_path / "eval.json").read_text())  # --metrics-out: the printed metrics, for scripts
    assert record["split"] == "test" and record["checkpoint"] == str(run / "checkpoints" / "final")
    assert {"eval/success", "eval/success_se", "eval_greedy/success"} <= record["metrics"].keys()
    lost = runner.invoke(app, ["eval", "--checkpoint", str(run / "checkpoints" / "final"), "--metrics-out",
                               str(tmp_path / "no" / "eval.json")])  # fmt: skip
    assert lost.exit_code == 2 and "--metrics-out" in lost.output and "folder does not exist" in lost.output
    # a second run into the same folder is refused, the first is untouched
    again = runner.invoke(app, ["train", *TINY, f"output_dir={tmp_path}", "run_name=smoke"])
    assert again.exit_code == 2 and "already exists" in again.output
    assert (run / "summary.json").is_file()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["train", "rl.lrr=1"], "unknown config key 'rl.lrr' (did you mean 'rl.lr'?)"),
        (["train", "rollout.group_size=-1"], "rollout.group_size"),
        (["train", "model.preset=huge"], "model.preset"),
        (["train", "--config", "/nonexistent.yaml"], "does not exist"),
        (["eval", "--checkpoint", "/nonexistent"], "not a checkpoint folder"),
        (["train", "model.init_from=/nonexistent"], "model.init_from"),
        (["train", "rollout.engine.kernel=gpu"], "rollout.engine.kernel"),
        (
            ["train", "rollout.engine.kernel=native", "rollout.engine.dtype=bfloat16"],
            "rollout.engine.kernel=native cannot run here: it computes in float32 only",
        ),
    ],
)
def test_user_mistakes_are_one_line_errors(args: list[str], expected: str) -> None:
    result = runner.invoke(app, args)
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert result.exit_code == 2
    assert expected in result.output
    assert "Traceback" not in result.output


def test_native_kernel_without_the_build_fails_before_any_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An install without the compiled decode step: asking for it is one line, before SFT and the run folder."""
    import harmonyrl.engine.local.native as native

    monkeypatch.setattr(native, "library", lambda: None)
    result = runner.invoke(app, ["train", *TINY, f"output_dir={tmp_path}", "rollout.engine.kernel=native"])
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert "engine.kernel=native cannot run here" in result.output and "was not built" in result.output
    assert not any(tmp_path.iterdir())


def test_corrupt_checkpoint_is_a_clear_error_and_leaves_no_run_folder(tmp_path: Path) -> None:
    from harmonyrl.harmony.tokenizer import HarmonyTokenizer
    from harmonyrl.models.tiny_gpt_oss import build_config, build_model, save_model

    tok = HarmonyTokenizer.load_default()
    good = tmp_path / "good"
    save_model(build_model(build_config("nano", tok.vocab_size, 0, 8), seed=0), good)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text((good / "config.json").read_text())
    (bad / "model.safetensors").write_bytes(b"\x00garbage" * 100)
    ev = runner.invoke(app, ["eval", "--checkpoint", str(bad)])
    assert ev.exit_code == 2 and "cannot load checkpoint" in ev.output and "Traceback" not in ev.output
    tr = runner.invoke(app, ["train", f"model.init_from={bad}", f"output_dir={tmp_path / 'runs'}", "run_name=r"])
    assert tr.exit_code == 2 and "cannot load checkpoint" in tr.output
    assert not (tmp_path / "runs" / "r").exists()  # a failed start leaves nothing that blocks a retry


def test_report_of_a_folder_without_metrics_is_a_one_line_error(tmp_path: Path) -> None:
    result = runner.invoke(app, ["report", str(tmp_path)])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "metrics" in result.output


def test_algorithm_choice_and_tensorboard_from_the_command_line(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard", reason="the [tensorboard] extra is not installed")
    args = [
        "train",
        *TINY,
        f"output_dir={tmp_path}",
        "run_name=ppo",
        "rl.advantage.kind=gae",
        "telemetry.tensorboard=true",
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (tmp_path / "ppo" / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r["phase"] == "rl" and not r.get("train/skipped")]
    assert rl and all("train/value_loss" in r for r in rl)
    assert list((tmp_path / "ppo" / "tensorboard").glob("events.out.tfevents.*"))


def test_compare_two_algorithms_writes_table_plot_and_json(tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    args = ["compare", "--algos", "grpo,sac", "--out", str(out), "--target", "0.0", *TINY, "rl.steps=2", "eval.every=1"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    table = (out / "compare.md").read_text()
    assert "| grpo |" in table and "| sac |" in table
    data = json.loads((out / "compare.json").read_text())
    assert [r["algo"] for r in data["results"]] == ["grpo", "sac"]
    for r in data["results"]:
        assert r["steps_to_target"] == 0  # target 0 is reached at the first (step 0) evaluation
        assert [s for s, _ in r["curve"]] == [0, 1, 2]
        rows = [json.loads(line) for line in (out / f"{r['algo']}-seed0" / "metrics.jsonl").read_text().splitlines()]
        last = [row for row in rows if "eval/success_se" in row][-1]  # one seed: the evaluation's own SE
        assert (r["final_se"], r["final_greedy_se"]) == (last["eval/success_se"], last["eval_greedy/success_se"])
    assert "1 seed(s) (0–0); held-out test split" in table and "± is the evaluation's task-clustered SE" in table
    assert data["results"][0]["vs_first"] == 0.0  # grpo is the reference; one seed: paired, without an SE
    assert "| grpo |" in table and "gain (paired) | vs first (paired)" in table
    assert (out / "compare.png").stat().st_size > 5_000
    # both algorithms started from the same warm start
    assert len(list(out.glob("sft-seed0/checkpoints/sft"))) == 1


def test_a_comparison_continues_from_its_finished_runs_of_the_same_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    from rich.console import Console

    import harmonyrl.jobs.compare as jobs
    from harmonyrl.config import load_config

    out = tmp_path / "cmp"
    overrides = [*TINY, "rl.steps=1", "eval.every=1"]
    cfg = load_config(None, overrides)
    first = asyncio.run(jobs.compare(cfg, ["grpo"], 1, 0.0, out, Console()))
    with pytest.raises(FileExistsError, match="already exists"):  # without reuse: a new folder, as before
        asyncio.run(jobs.compare(cfg, ["grpo"], 1, 0.0, out, Console()))

    async def no_training(*args: object, **kwargs: object) -> None:
        raise AssertionError("a finished run must be read, not run again")

    monkeypatch.setattr(jobs, "train", no_training)
    monkeypatch.setattr(jobs, "sft_only", no_training)
    again = asyncio.run(jobs.compare(cfg, ["grpo"], 1, 0.0, out, Console(), reuse=True))
    assert again == first
    moved = tmp_path / "moved"
    out.rename(moved)  # a comparison moved elsewhere is still the same runs
    assert asyncio.run(jobs.compare(cfg, ["grpo"], 1, 0.0, moved, Console(), reuse=True))[0].final_success == (
        first[0].final_success
    )
    other = load_config(None, [*overrides, "rl.lr=3e-4"])
    with pytest.raises(FileExistsError, match=r"was run with another config \(sections rl\): delete it"):
        asyncio.run(jobs.compare(other, ["grpo"], 1, 0.0, moved, Console(), reuse=True))


def test_compare_pools_seeds_with_the_standard_error_between_them() -> None:
    from harmonyrl.jobs.compare import _summarise

    def run(final: float, greedy: float) -> list[dict[str, object]]:
        evals = [(0, 0.1, 0.5), (4, final, greedy)]
        return [{"phase": "eval", "step": s, "eval/success": p, "eval/success_se": 0.05, "eval_greedy/success": g,
                 "eval_greedy/success_se": 0.07} for s, p, g in evals]  # fmt: skip

    r = _summarise("grpo", [run(0.2, 0.6), run(0.4, 0.8)], [1.0, 1.0], 0.5)
    assert r.final_success == pytest.approx(0.3) and r.final_greedy == pytest.approx(0.7)
    assert r.final_se == pytest.approx(0.1) and r.final_greedy_se == pytest.approx(0.1)  # sd 0.1414 / sqrt(2)
    assert _summarise("grpo", [run(0.2, 0.6)], [1.0], 0.5).final_se == 0.05  # one seed: the evaluation's SE


def test_compare_rejects_unknown_algorithm_in_one_line(tmp_path: Path) -> None:
    result = runner.invoke(app, ["compare", "--algos", "grpo,ppo2", "--out", str(tmp_path / "x")])
    assert result.exit_code != 0 and "ppo2" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "x").exists()


def test_check_env_passes_the_readme_example_and_flags_a_broken_env(tmp_path: Path) -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "unit_env.py"
    ok = runner.invoke(app, ["check-env", f"{example}:UnitFactory"])
    assert ok.exit_code == 0, ok.output
    broken = tmp_path / "broken_env.py"
    broken.write_text(
        example.read_text().replace("return StepResult(reward=float(correct)", "return StepResult(reward=5.0 + correct")
    )
    bad = runner.invoke(app, ["check-env", f"{broken}:UnitFactory"])
    assert bad.exit_code == 1 and "reward" in bad.output


@pytest.mark.parametrize(
    ("target", "needle"),
    [
        ("no_colon", "no_colon: expected MODULE:NAME or FILE.py:NAME"),
        ("examples/missing.py:F", "no such file: 'examples/missing.py'"),
        ("harmonyrl.no_such_module:F", "harmonyrl.no_such_module:F: module 'harmonyrl.no_such_module' not found"),
        ("json:nope", "json:nope: 'json' has no 'nope'"),
    ],
)
def test_check_env_bad_targets_are_one_line_errors(target: str, needle: str) -> None:
    result = runner.invoke(app, ["check-env", target])
    assert result.exit_code == 2 and "Traceback" not in result.output and "error" in result.output
    assert needle in " ".join(result.output.split())  # the message says what was wrong with which target


@pytest.mark.parametrize("env", ["sql", "retool", "instruct"])
def test_other_environments_train_end_to_end(tmp_path: Path, env: str) -> None:
    if env == "retool":
        from harmonyrl.sandbox import SandboxUnavailable, check_sandbox

        try:
            check_sandbox()
        except SandboxUnavailable as e:
            pytest.skip(f"bubblewrap cannot run here: {e}")
    args = ["train", *TINY, f"output_dir={tmp_path}", f"run_name={env}", f"env.name={env}", "env.n_train=32"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (tmp_path / env / "metrics.jsonl").read_text().splitlines()]
    assert [r["phase"] for r in rows].count("rl") == 2
    episodes = (tmp_path / env / "rollouts" / "episodes.jsonl").read_text().splitlines()
    assert len(episodes) == 2 * 2 * 2 and all(json.loads(e)["task_id"].startswith(env) for e in episodes)
    assert f"name: {env}" in (tmp_path / env / "config.yaml").read_text()


def test_replay_and_show_on_a_recorded_run(tmp_path: Path) -> None:
    # an entropy bonus makes both steps real updates even when every early reward is 0
    args = ["train", *TINY, f"output_dir={tmp_path}", "run_name=rec", "rl.entropy_coef=0.01",
            "rl.skip_zero_variance_groups=false"]  # fmt: skip
    assert runner.invoke(app, args).exit_code == 0
    run = tmp_path / "rec"
    step1 = runner.invoke(app, ["replay", str(run), "--step", "1", "--save", str(tmp_path / "after1")])
    assert step1.exit_code == 0, step1.output
    step2 = runner.invoke(
        app, ["replay", str(run), "--step", "2", "--checkpoint", str(tmp_path / "after1"), "--rescore"]
    )
    assert step2.exit_code == 0 and "bit-identical" in step2.output, step2.output
    shown = runner.invoke(app, ["show", str(run), "--step", "2", "--limit", "2"])
    assert shown.exit_code == 0 and "reward" in shown.output.lower()
    missing = runner.invoke(app, ["show", str(run), "--step", "9"])
    assert missing.exit_code == 2 and "Traceback" not in missing.output
    chained = runner.invoke(app, ["replay", str(run), "--step", "2"])  # no state after step 1: step 1 replayed first
    assert chained.exit_code == 0, chained.output
    assert "steps 1-1 replayed first" in chained.output and "equal to metrics.jsonl" in chained.output
    assert "bit-identical" in chained.output and "{'" not in chained.output  # a table, not a Python dict


def test_warm_start_on_a_users_task_file_is_a_one_line_error(tmp_path: Path) -> None:
    """The scripted expert only knows the generated questions: SFT on a user's tasks must say what to do instead."""
    tasks = tmp_path / "tasks.jsonl"
    rows = [
        {"id": f"mine-{i}", "prompt": f"How many rows are in table t{i}?", "answer": "1", "split": split}
        for i, split in enumerate(["train", "train", "test"])
    ]
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = [
        "train",
        *TINY,
        f"output_dir={tmp_path}",
        "env.name=sql",
        f"env.tasks_file={tasks}",
        "env.n_train=2",
        "env.n_test=1",
    ]
    result = runner.invoke(app, args)
    assert result.exit_code != 0
    assert "not a generated sql question" in result.output and "sft.steps=0" in result.output, result.output
    assert "Traceback" not in result.output


def test_show_on_a_run_without_rl_steps_says_so(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("seed: 0\n")  # an SFT-only run's folder: config, no rollouts/
    result = runner.invoke(app, ["show", str(tmp_path), "--step", "1"])
    assert result.exit_code == 2 and "has no RL steps recorded: an SFT-only run" in " ".join(result.output.split())
