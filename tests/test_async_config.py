"""``rl.async``: a Python keyword as a config key (read and written as ``async``), and its one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from harmonyrl.config import ConfigError, dump_config, load_config

ASYNC = ["rl.async.max_staleness=2", "rl.correction.weights.mode=truncate"]


def test_the_section_is_written_and_read_back_as_async(tmp_path: Path) -> None:
    config = load_config(None, ASYNC)
    assert config.rl.async_.max_staleness == 2 and config.rl.async_.enabled
    text = dump_config(config)
    assert "  async:\n    max_staleness: 2\n" in text and "async_" not in text
    (tmp_path / "c.yaml").write_text(text)
    assert load_config(tmp_path / "c.yaml") == config
    assert not load_config(None, []).rl.async_.enabled  # synchronous by default


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["rl.async.max_staleness=1"], "config: rl.async.max_staleness=1 trains on older policies' samples"),
        ([*ASYNC, "rl.correction.bypass=true"], "decoupled PPO needs rl.correction.weights"),
        (
            ["rl.async.max_stalenes=1"],
            "(did you mean 'rl.async.max_staleness'?)",
        ),
        (
            ["rl.async.max_staleness=-1"],
            "'rl.async.max_staleness': Input should be greater than or equal to 0",
        ),
    ],
)
def test_mistakes_are_one_line_errors(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert message in str(err.value) and "\n" not in str(err.value)
