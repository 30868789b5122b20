"""``harmonyrl eval`` picks the env a checkpoint was trained on, and refuses a different one unless asked."""

from __future__ import annotations

from pathlib import Path

import pytest

from harmonyrl.config import ConfigError, dump_config, load_config
from harmonyrl.run.checkpoint_files import RUN_CONFIG_FILE
from harmonyrl.run.eval_env import explicit_env, resolve_eval_env
from harmonyrl.tasks.config import CalculatorEnvConfig, MazeEnvConfig

MAZE = ["env.name=maze", "env.n_train=16", "env.n_test=4", "env.size=3"]


def _checkpoint(folder: Path, trained: list[str] | None) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")  # resolve_eval_env reads only the record
    if trained is not None:
        (folder / RUN_CONFIG_FILE).write_text(dump_config(load_config(None, trained)))
    return folder


def _resolve(ckpt: Path, overrides: list[str], allow: bool = False) -> tuple[object, str]:
    chosen = resolve_eval_env(load_config(None, overrides), ckpt, explicit_env(None, overrides), allow)
    return chosen.config.env, chosen.message


def test_recorded_env_is_used_by_default(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path / "c", MAZE)
    env, message = _resolve(ckpt, ["eval.n_tasks=3"])  # not an env key: nothing explicit
    assert env == MazeEnvConfig(n_train=16, n_test=4, size=3)
    assert message == f"evaluating env 'maze', the env '{ckpt}' was trained on (from {ckpt / RUN_CONFIG_FILE})"


def test_explicit_env_keys_layer_on_the_record_and_equal_ones_pass(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path / "c", MAZE)
    env, _ = _resolve(ckpt, ["env.name=maze", "env.size=3"])
    assert env == MazeEnvConfig(n_train=16, n_test=4, size=3)  # n_train/n_test from the record, not the defaults


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["env.name=calculator"], "env.name='calculator', trained with 'maze'"),
        (["env.n_test=8"], "env.n_test=8, trained with 4; drop the env.* settings"),
    ],
)
def test_a_differing_env_is_refused_in_one_line(tmp_path: Path, overrides: list[str], expected: str) -> None:
    ckpt = _checkpoint(tmp_path / "c", MAZE)
    with pytest.raises(ConfigError) as info:
        _resolve(ckpt, overrides)
    assert expected in str(info.value) and "--allow-env-mismatch" in str(info.value)
    assert "\n" not in str(info.value)


def test_a_mismatch_runs_when_asked_and_says_so(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path / "c", MAZE)
    env, message = _resolve(ckpt, ["env.name=calculator", "env.n_test=8"], allow=True)
    assert env == CalculatorEnvConfig(n_test=8)
    assert message.startswith("evaluating env 'calculator' although") and "trained with 'maze'" in message


def test_yaml_env_section_counts_as_explicit(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path / "c", MAZE)
    yaml_file = tmp_path / "eval.yaml"
    yaml_file.write_text("env:\n  name: calculator\n")
    assert explicit_env(yaml_file, ["env.n_test=7", "seed=3"]) == {"name": "calculator", "n_test": 7}
    with pytest.raises(ConfigError, match="trained on another env"):
        resolve_eval_env(load_config(yaml_file, []), ckpt, explicit_env(yaml_file, []))


def test_no_record_says_which_env_and_why(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path / "plain", None)
    env, message = _resolve(ckpt, [])
    assert env == CalculatorEnvConfig()
    assert message.startswith(f"evaluating env 'calculator' from the defaults: '{ckpt}' does not record the env")
    _, message = _resolve(ckpt, ["env.n_test=9"])
    assert "from your config" in message


def test_an_older_checkpoint_uses_its_run_folders_config(tmp_path: Path) -> None:
    run = tmp_path / "run"
    ckpt = _checkpoint(run / "checkpoints" / "final", None)
    (run / "config.yaml").write_text(dump_config(load_config(None, MAZE)))
    env, message = _resolve(ckpt, [])
    assert isinstance(env, MazeEnvConfig) and f"(from {run / 'config.yaml'})" in message


def test_an_unreadable_record_is_a_one_line_error(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path / "c", None)
    (ckpt / RUN_CONFIG_FILE).write_text("env:\n  name: nope\n")
    with pytest.raises(ConfigError, match=f"training record '{ckpt / RUN_CONFIG_FILE}' is not a valid run config"):
        _resolve(ckpt, [])
