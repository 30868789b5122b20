from pathlib import Path

import pytest
from pydantic import ValidationError

from harmonyrl.config import ConfigError, RunConfig, dump_config, load_config


def test_defaults_validate_and_are_frozen() -> None:
    cfg = load_config()
    assert isinstance(cfg, RunConfig) and cfg.rollout.episodes_per_step == 128
    with pytest.raises(ValidationError):
        cfg.rl.lr = 1.0  # type: ignore[misc]


def test_overrides_parse_types() -> None:
    cfg = load_config(None, ["rl.lr=3e-4", "rollout.group_size=4", "rl.advantage.std_normalize=false", "run_name=x"])
    assert cfg.rl.lr == 3e-4 and cfg.rollout.group_size == 4 and cfg.rl.advantage.std_normalize is False


def test_unknown_key_names_nearest() -> None:
    with pytest.raises(ConfigError, match=r"unknown config key 'rl\.lrr'.*did you mean 'rl\.lr'"):
        load_config(None, ["rl.lrr=1"])


def test_bad_value_names_key() -> None:
    with pytest.raises(ConfigError, match=r"rollout\.group_size"):
        load_config(None, ["rollout.group_size=0"])
    with pytest.raises(ConfigError, match=r"model\.preset"):
        load_config(None, ["model.preset=huge"])


@pytest.mark.parametrize("value", ["-1", "inf", "nan"])
def test_prefix_cache_budget_must_be_finite_and_non_negative(value: str) -> None:
    with pytest.raises(ConfigError, match=r"rollout\.engine\.prefix_cache_mib"):
        load_config(overrides=[f"rollout.engine.prefix_cache_mib={value}"])
    assert load_config(overrides=["rollout.engine.prefix_cache_mib=0"]).rollout.engine.prefix_cache_mib == 0


def test_yaml_round_trip(tmp_path: Path) -> None:
    cfg = load_config(None, ["rl.steps=3"])
    p = tmp_path / "c.yaml"
    p.write_text(dump_config(cfg))
    assert load_config(p) == cfg


def test_missing_file_and_bad_override() -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(Path("/nonexistent.yaml"))
    with pytest.raises(ConfigError, match="key=value"):
        load_config(None, ["rl.steps"])


@pytest.mark.parametrize(
    "override",
    ["rollout.fault_breaker.max_fraction=1.5", "rollout.fault_breaker.max_fraction=-0.1",
     "rollout.fault_breaker.max_fraction=nan", "rollout.fault_breaker.consecutive_steps=0"],
)  # fmt: skip
def test_fault_breaker_bounds(override: str) -> None:
    with pytest.raises(ConfigError, match=r"rollout\.fault_breaker\."):
        load_config(None, [override])
    cfg = load_config(None, ["rollout.fault_breaker.max_fraction=1", "rollout.fault_breaker.consecutive_steps=1"])
    assert (cfg.rollout.fault_breaker.max_fraction, cfg.rollout.fault_breaker.consecutive_steps) == (1.0, 1)


def test_config_file_that_is_a_directory_or_not_utf8(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(tmp_path)
    bad = tmp_path / "c.yaml"
    bad.write_bytes(b"run_name: caf\xe9\n")
    with pytest.raises(ConfigError, match=r"is not UTF-8 text \(invalid continuation byte at byte 13\)"):
        load_config(bad)
