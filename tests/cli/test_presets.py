"""Named presets (``-p NAME``): the folder's listing, the order a preset, ``-c`` and overrides apply in, and the
one-line errors; the shipped presets are valid configs. No training runs here."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from harmonyrl import preset_files
from harmonyrl.cli import app
from harmonyrl.config import ConfigError, load_config
from harmonyrl.preset_files import PresetError, available, find

runner = CliRunner()


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A presets folder of our own in place of the shipped one."""
    d = tmp_path / "presets"
    d.mkdir()
    _write(d / "quick.yaml", "# quick: few steps\n# (second comment line is not the description)\nrl:\n  steps: 3\n")
    _write(d / "maze.yml", "\n#   a maze one  \nenv:\n  name: maze\n")
    _write(d / "bare.yaml", "rl:\n  lr: 0.001\n# a comment after the first key\n")
    _write(d / "notes.txt", "# not a preset\n")
    monkeypatch.setattr(preset_files, "PRESETS_DIR", d)
    return d


def test_listing_names_files_and_first_comment_line(folder: Path) -> None:
    listed = [(p.name, p.description) for p in available()]
    # sorted by file name; .yaml and .yml both count, other files do not; the description is the first comment
    # line only if it comes before the first key
    assert listed == [("bare", ""), ("maze", "a maze one"), ("quick", "quick: few steps")]
    assert find("maze") == folder / "maze.yml"


def test_a_description_running_over_lines_is_its_whole_first_sentence(tmp_path: Path) -> None:
    _write(tmp_path / "a.yaml", "# a: a sentence that runs on\n# over two lines. A second one.\n# More.\nseed: 1\n")
    _write(tmp_path / "b.yaml", "# b: a title without a full stop\n# Details on their own line.\nseed: 1\n")
    _write(tmp_path / "c.yaml", "# c: runs on\n# (an aside) to the end\n# of the line.\nseed: 1\n")
    assert [p.description for p in available(tmp_path)] == [
        "a: a sentence that runs on over two lines.",
        "b: a title without a full stop",
        "c: runs on",
    ]


def test_unknown_name_is_one_line_naming_the_known_ones(folder: Path) -> None:
    with pytest.raises(PresetError) as e:
        find("quik")
    assert str(e.value) == "unknown preset 'quik' (known: bare, maze, quick; `harmonyrl presets` describes them)"
    result = runner.invoke(app, ["train", "-p", "quik", "rl.steps=1"])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert lines == ["error: unknown preset 'quik' (known: bare, maze, quick; `harmonyrl presets` describes them)"]


def test_merge_order_preset_then_file_then_overrides(tmp_path: Path) -> None:
    preset = _write(tmp_path / "p.yaml", "rl:\n  lr: 0.003\n  steps: 7\n  loss:\n    clip_high: 0.35\nseed: 4\n")
    file = _write(tmp_path / "c.yaml", "rl:\n  lr: 0.002\n  loss:\n    clip_low: 0.1\n")
    cfg = load_config(file, ["rl.steps=9"], [preset])
    # the file replaces rl.lr and adds clip_low, keeping the preset's clip_high and seed (a merge, not a swap of
    # the whole rl section); the override replaces rl.steps
    assert (cfg.rl.lr, cfg.rl.steps, cfg.seed) == (0.002, 9, 4)
    assert (cfg.rl.loss.clip_low, cfg.rl.loss.clip_high) == (0.1, 0.35)  # type: ignore[union-attr]
    alone = load_config(None, [], [preset])
    assert (alone.rl.lr, alone.rl.steps, alone.rl.loss.clip_low) == (0.003, 7, 0.2)  # type: ignore[union-attr]
    # a preset is checked as a -c file is: an unknown key is an error naming it
    with pytest.raises(ConfigError, match=r"unknown config key 'rl\.lrr'"):
        load_config(None, [], [_write(tmp_path / "bad.yaml", "rl:\n  lrr: 1\n")])


def test_cli_applies_preset_before_c_and_overrides(tmp_path: Path, folder: Path) -> None:
    """Each layer sets an invalid rl.steps: the error shows which one won, so nothing trains."""
    _write(folder / "neg.yaml", "# negative steps\nrl:\n  steps: -1\n")
    file = _write(tmp_path / "c.yaml", "rl:\n  steps: -2\n")
    cases = [
        (["-p", "neg"], "-1"),
        (["-p", "neg", "-c", str(file)], "-2"),
        (["-p", "neg", "-c", str(file), "rl.steps=-3"], "-3"),
    ]
    for command in ("train", "sft"):
        for args, shown in cases:
            result = runner.invoke(app, [command, *args])
            assert result.exit_code == 2, result.output
            assert "config key 'rl.steps'" in result.output and f"(got {shown})" in result.output, result.output
    result = runner.invoke(app, ["train", "-p", "neg", "--resume", str(tmp_path)])
    assert result.exit_code == 2 and "do not pass --config, overrides or --overwrite (or -p)" in result.output


def test_presets_command_and_preset_list(folder: Path) -> None:
    for args in (["presets"], ["train", "--preset", "list"], ["sweep", "-p", "list"], ["sft", "-p", "list"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 0, (args, result.output)
        lines = result.output.splitlines()
        assert [ln.split()[0] for ln in lines[:3]] == ["bare", "maze", "quick"], (args, result.output)
        assert lines[2].split(None, 1)[1] == "quick: few steps"
        assert len(lines) == 4 and lines[3].startswith("(YAML files in ")


def test_shipped_presets_are_valid_configs_with_descriptions() -> None:
    shipped = available()
    assert "fast" in {p.name for p in shipped}
    for p in shipped:  # every YAML in the folder, whoever added it: a -c file the schema accepts
        assert p.description, f"preset {p.name} has no description comment"
        load_config(None, [], [p.path])


def test_the_preset_is_named_in_the_runs_first_line_and_config_yaml(tmp_path: Path, folder: Path) -> None:
    from tiny_run import tiny_run

    args = ["train", "-p", "quick", *tiny_run("rl.steps=1"), f"output_dir={tmp_path}", "run_name=r"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0].startswith(f"run folder {tmp_path / 'r'}  preset quick  model nano")
    recorded = load_config(tmp_path / "r" / "config.yaml")
    assert (recorded.preset, recorded.rl.steps) == ("quick", 1)  # named; its values applied under the overrides


def test_algorithm_presets_are_typed_rl_sections_that_compare_and_presets_use(folder: Path) -> None:
    from harmonyrl.algorithms.choices import GAE, GRPO, NamedAlgorithm, PolicyGradient, SoftQ
    from harmonyrl.jobs.compare import algorithm_names, named_algorithm, parse_algos

    algos = folder / "algorithms"
    algos.mkdir()
    _write(algos / "mine.yaml", "# mine: GAE and plain PG.\nrl:\n  advantage:\n    kind: gae\n  loss:\n    kind: pg\n")
    _write(algos / "soft.yaml", "# soft: the soft-Q row.\nrl:\n  loss:\n    kind: soft_q\n    alpha: 0.5\n")
    _write(algos / "typo.yaml", "rl:\n  loss:\n    kind: ppo_clip\n  advantge:\n    kind: gae\n")
    assert algorithm_names() == ["mine", "soft", "typo"]  # the folder's files are the names compare accepts
    assert parse_algos("soft, mine") == ["soft", "mine"]
    assert named_algorithm("mine") == NamedAlgorithm(advantage=GAE(), loss=PolicyGradient())
    assert named_algorithm("soft").loss == SoftQ(alpha=0.5) and named_algorithm("soft").advantage is None
    with pytest.raises(ValueError, match="advantge"):  # typed: a misspelt choice is an error, not ignored
        named_algorithm("typo")
    with pytest.raises(ConfigError, match=r"unknown algorithm\(s\) \['ppo'\]; choose from mine, soft, typo"):
        parse_algos("ppo")
    lines = runner.invoke(app, ["presets"]).output.splitlines()
    assert lines[3:5] == [
        "mine         (compare --algos) mine: GAE and plain PG.",
        "soft         (compare --algos) soft: the soft-Q row.",
    ]
    # applied on top of a run's rl settings, a choice the preset sets replaces the run's whole; unset ones stay
    from harmonyrl.jobs.compare import _rl_for

    run = load_config(None, ["rl.advantage.std_normalize=false", "rl.loss.clip_high=0.3", "rl.lr=0.003"])
    soft = _rl_for(run, "soft")
    assert soft.advantage == GRPO(std_normalize=False) and soft.loss == SoftQ(alpha=0.5) and soft.lr == 0.003
    assert _rl_for(run, "mine").advantage == GAE()


def test_shipped_algorithm_presets_validate_and_describe_themselves() -> None:
    from harmonyrl.jobs.compare import algorithm_names, named_algorithm

    shipped = available(preset_files.algorithms_folder())
    assert {"ppo", "grpo", "dr_grpo", "rloo", "reinforce_pp", "gspo", "a2c", "sac"} <= set(algorithm_names())
    for p in shipped:  # each is typed, described, and also a valid rl section of a run config (-c FILE)
        assert p.description, f"algorithm preset {p.name} has no description comment"
        named_algorithm(p.name)
        load_config(None, [], [p.path])
