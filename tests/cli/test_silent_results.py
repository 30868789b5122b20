"""Issue 24 item 2 from the command line: nothing that changes a result happens without a word.

* ``eval`` runs the env a checkpoint was trained on, and refuses another one unless ``--allow-env-mismatch``;
* ``model.init_from`` says whether SFT runs, and ``config.yaml`` records what ran;
* a run of skipped RL updates is warned about, naming the cause;
* ``rollout.max_seq_len`` beyond the checkpoint's positions is a one-line error before any work.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

from harmonyrl.cli import app
from harmonyrl.config import load_config
from harmonyrl.harmony.tokenizer import HarmonyTokenizer
from harmonyrl.models.tiny_gpt_oss import build_config, build_model, save_model
from harmonyrl.run.checkpoint import save_checkpoint
from harmonyrl.run.checkpoint_files import CheckpointFiles

runner = CliRunner()
SMALL = ["rollout.tasks_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=16", "eval.n_tasks=1"]
QUICK_EVAL = ["eval.n_tasks=1", "eval.samples_per_task=1", "rollout.max_new_tokens=8", "rollout.max_turns=1"]


def _nano(folder: Path, max_positions: int = 1024, trained_on: list[str] | None = None) -> Path:
    """An untrained nano checkpoint; with ``trained_on``, one recording that run config (as harmonyrl writes)."""
    tok = HarmonyTokenizer.load_default()
    cfg = build_config("nano", tok.vocab_size, tok.special.endoftext, tok.special.return_, max_positions)
    model = build_model(cfg, seed=0)
    if trained_on is None:
        save_model(model, folder)
        return folder
    return save_checkpoint(folder, model, None, 0, {}, CheckpointFiles(load_config(None, trained_on), tok))


def _one_line(output: str) -> str:
    return " ".join(output.split())  # rich wraps long lines


def test_eval_runs_the_checkpoints_env_and_refuses_another(tmp_path: Path) -> None:
    maze = _nano(tmp_path / "maze", trained_on=["env.name=maze", "env.n_train=16", "env.n_test=4", "env.size=3"])
    ok = runner.invoke(app, ["eval", "--checkpoint", str(maze), *QUICK_EVAL])
    assert ok.exit_code == 0, ok.output
    assert f"evaluating env 'maze', the env '{maze}' was trained on" in _one_line(ok.output)
    refused = runner.invoke(app, ["eval", "--checkpoint", str(maze), "env.name=calculator", *QUICK_EVAL])
    assert refused.exit_code == 2 and len(refused.output.strip().splitlines()) == 1, refused.output
    assert "trained on another env: env.name='calculator', trained with 'maze'" in refused.output
    assert "--allow-env-mismatch" in refused.output
    asked = ["eval", "--checkpoint", str(maze), "--allow-env-mismatch", "env.name=calculator", "env.n_test=8"]
    forced = runner.invoke(app, [*asked, *QUICK_EVAL])
    assert forced.exit_code == 0, forced.output
    assert "evaluating env 'calculator' although" in _one_line(forced.output)


def test_eval_of_a_checkpoint_without_a_record_says_which_env(tmp_path: Path) -> None:
    plain = _nano(tmp_path / "plain")
    result = runner.invoke(app, ["eval", "--checkpoint", str(plain), *QUICK_EVAL])
    assert result.exit_code == 0, result.output
    assert f"evaluating env 'calculator' from the defaults: '{plain}' does not record" in _one_line(result.output)


def test_init_from_says_whether_sft_runs_and_records_what_ran(tmp_path: Path) -> None:
    start = _nano(tmp_path / "start")
    common = ["train", "model.preset=nano", f"model.init_from={start}", *SMALL, "env.n_train=64", "env.n_test=8"]
    skip = runner.invoke(app, [*common, "rl.steps=3", f"output_dir={tmp_path}", "run_name=skip"])
    assert skip.exit_code == 0, skip.output
    out = _one_line(skip.output)
    assert f"SFT warm start: none, model.init_from={start} is the warm start" in out
    run = tmp_path / "skip"
    assert yaml.safe_load((run / "config.yaml").read_text())["sft"]["steps"] == 0  # records what ran
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert not [r for r in rows if r["phase"] == "sft"] and not (run / "checkpoints" / "sft").exists()
    # an untrained model never solves a task: every group scores 0, every update is skipped, and it is said
    rl = [r for r in rows if r["phase"] == "rl"]
    assert all(r["train/skipped"] == 1.0 and r["rollout/equal_reward_groups"] == r["rollout/groups"] == 2 for r in rl)
    assert "RL: 3 updates in a row skipped, nothing to train on: all 2 groups had equal rewards" in out
    assert "the task may be too hard for the warm start" in out and "RL: 3 of 3 updates skipped" in out
    # every checkpoint carries the tokenizer and the resolved config
    for name in ("last", "final"):
        assert (run / "checkpoints" / name / "tokenizer_config.json").is_file(), name
        assert (run / "checkpoints" / name / "harmonyrl_config.yaml").is_file(), name

    given = runner.invoke(app, [*common, "sft.steps=2", "sft.batch_size=2", "rl.steps=1", f"output_dir={tmp_path}"])
    assert given.exit_code == 0, given.output
    assert f"SFT warm start: 2 steps from model.init_from={start} (sft.steps given)" in _one_line(given.output)
    run = next(p for p in tmp_path.iterdir() if p.name not in ("skip", "start"))
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["phase"] == "sft"] == [0, 1]
    assert yaml.safe_load((run / "config.yaml").read_text())["sft"]["steps"] == 2
    assert (run / "checkpoints" / "sft" / "tokenizer.json").is_file()


def test_max_seq_len_beyond_the_models_positions_is_one_line(tmp_path: Path) -> None:
    short = _nano(tmp_path / "short", max_positions=64)
    expected = f"rollout.max_seq_len=128 exceeds the max_position_embeddings=64 of checkpoint '{short}'"
    for args in (
        ["eval", "--checkpoint", str(short), "rollout.max_seq_len=128"],
        ["train", f"model.init_from={short}", "rollout.max_seq_len=128", f"output_dir={tmp_path}", "run_name=r"],
    ):
        result = runner.invoke(app, args)
        assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
        assert expected in _one_line(result.output) and "Traceback" not in result.output
    assert not (tmp_path / "r").exists()  # refused before the run folder exists
    fits = runner.invoke(app, ["eval", "--checkpoint", str(short), "rollout.max_seq_len=64", *QUICK_EVAL])
    assert fits.exit_code == 0, fits.output
