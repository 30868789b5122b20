"""The search space of ``harmonyrl sweep``: the command-line and YAML forms, and every mistake a one-line error
(exit 2) before any trial runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from harmonyrl.cli import app
from harmonyrl.config import load_config
from harmonyrl.sweep.space import (
    ChoiceParam,
    FloatParam,
    IntParam,
    LogParam,
    SpaceError,
    build_space,
    check_space,
    load_space_file,
    override,
    parse_param,
    probes,
)


def test_each_kind_parses() -> None:
    assert parse_param("rl.lr=log:1e-5:1e-3") == ("rl.lr", LogParam(low=1e-5, high=1e-3))
    assert parse_param("rl.loss.clip_high=float:0.2:0.4") == ("rl.loss.clip_high", FloatParam(low=0.2, high=0.4))
    assert parse_param("x=float:0:1:0.25") == ("x", FloatParam(low=0.0, high=1.0, step=0.25))
    assert parse_param("rollout.group_size=int:4:16:4") == ("rollout.group_size", IntParam(low=4, high=16, step=4))
    key, choice = parse_param("rl.advantage.kind=choice:grpo,rloo")
    assert (key, choice) == ("rl.advantage.kind", ChoiceParam(values=("grpo", "rloo")))
    # choices read as overrides do: numbers, booleans and null, not strings
    assert parse_param("a=choice:8,16,true,null")[1] == ChoiceParam(values=(8, 16, True, None))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("rl.lr", "is not KEY=SPEC"),
        ("rl.lr=lg:1:2", "expected float:LOW:HIGH"),
        ("rl.lr=log:1e-3", "expected float:LOW:HIGH"),
        ("rl.lr=log:1e-3:1e-5", "log needs 0 < LOW < HIGH (got 0.001, 1e-05)"),
        ("rl.lr=log:-1:1e-3", "low: Input should be greater than 0"),
        ("rl.lr=log:1:2:3", "expected float:LOW:HIGH"),
        ("g=int:4:2", "int needs LOW < HIGH (got 4, 2)"),
        ("g=int:1.5:4", "'1.5:4' are not integers"),
        ("g=choice:4,4", "choice lists a value twice"),
    ],
)
def test_malformed_param_is_one_line_error(text: str, message: str) -> None:
    with pytest.raises(SpaceError) as e:
        parse_param(text)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_override_reads_back_as_the_same_value() -> None:
    # YAML 1.1 reads "1e-05" as a string; the override keeps a decimal point so it is the float 1e-05
    assert override("rl.lr", 1e-05) == "rl.lr=1.0e-05"
    assert override("rl.lr", 0.000123) == "rl.lr=0.000123"
    assert override("a", True) == "a=true" and override("a", None) == "a=null" and override("g", 8) == "g=8"
    assert load_config(None, [override("rl.lr", 1e-05)]).rl.lr == 1e-05


def test_yaml_space_three_forms(tmp_path: Path) -> None:
    path = tmp_path / "space.yaml"
    path.write_text(
        "rl.lr: log:1e-5:1e-3\nrl.loss.clip_high: {kind: float, low: 0.2, high: 0.4}\nrollout.group_size: [8, 16]\n"
    )
    assert load_space_file(path) == {
        "rl.lr": LogParam(low=1e-5, high=1e-3),
        "rl.loss.clip_high": FloatParam(low=0.2, high=0.4),
        "rollout.group_size": ChoiceParam(values=(8, 16)),
    }
    # a --param replaces the file's range for its key and adds the others
    space = build_space(path, ["rl.lr=log:1e-4:1e-2", "rl.entropy_coef=float:0:0.01"])
    assert space["rl.lr"] == LogParam(low=1e-4, high=1e-2) and len(space) == 4


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("- a\n- b\n", "must be a mapping"),
        ("rl.lr: {kind: log, low: 1e-3}\n", "key 'rl.lr': high: Field required"),
        ("rl.lr: {kind: uniform, low: 0, high: 1}\n", "key 'rl.lr'"),
        ("rl.lr: [oops\n", "is not valid YAML"),
    ],
)
def test_bad_yaml_space(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "space.yaml"
    path.write_text(content)
    with pytest.raises(SpaceError, match=r".*") as e:
        load_space_file(path)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_probes_stand_for_the_range() -> None:
    # ends, and a point 37 % of the way (on the log scale for log): no integer field accepts 1 + 0.37 * 2 = 1.74
    assert probes(FloatParam(low=1, high=3)) == pytest.approx([1, 3, 1.74])
    assert probes(LogParam(low=1e-4, high=1e-2)) == pytest.approx([1e-4, 1e-2, 10 ** (-4 + 0.37 * 2)])
    assert probes(FloatParam(low=0, high=1, step=0.25)) == [0, 1, 0.25]  # floor(0.37 / 0.25) = 1 grid step
    assert probes(IntParam(low=2, high=9)) == [2, 9]


def _check(space: dict[str, object], fixed: list[str] | None = None) -> None:
    check_space(space, fixed or [], lambda extra: load_config(None, extra))  # type: ignore[arg-type]


def test_space_checked_against_the_schema() -> None:
    _check({"rl.lr": LogParam(low=1e-5, high=1e-3), "rollout.group_size": ChoiceParam(values=(8, 16))})
    with pytest.raises(SpaceError, match=r"unknown config key 'rl\.lrr' \(did you mean 'rl\.lr'\?\)"):
        _check({"rl.lrr": LogParam(low=1e-5, high=1e-3)})
    with pytest.raises(SpaceError, match=r"'rollout.group_size' at 0: .*greater than or equal to 1"):
        _check({"rollout.group_size": IntParam(low=0, high=8)})
    with pytest.raises(SpaceError, match=r"'rollout.group_size' at 4.22: .*valid integer"):  # 2 + 0.37 * 6
        _check({"rollout.group_size": FloatParam(low=2, high=8)})
    with pytest.raises(SpaceError, match=r"'rl\.advantage\.kind' at 'bogus'"):
        _check({"rl.advantage.kind": ChoiceParam(values=("grpo", "bogus"))})
    with pytest.raises(SpaceError, match="'threads' cannot be searched"):
        _check({"threads": IntParam(low=1, high=2)})
    with pytest.raises(SpaceError, match=r"'rl\.lr' is both a fixed override and a searched parameter"):
        _check({"rl.lr": LogParam(low=1e-5, high=1e-3)}, ["rl.lr=1e-4"])


def test_a_fixed_override_changes_what_the_range_is_checked_against() -> None:
    # rl.loss.clip_low exists for ppo_clip (the default) but not for pg: the range is checked on the fixed choice
    _check({"rl.loss.clip_low": FloatParam(low=0.1, high=0.3)})
    with pytest.raises(SpaceError, match="does not apply to the chosen kind"):
        _check({"rl.loss.clip_low": FloatParam(low=0.1, high=0.3)}, ["rl.loss.kind=pg"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--param", "rl.lrr=log:1e-5:1e-3"], "error: search space 'rl.lrr' at 1e-05: unknown config key 'rl.lrr'"),
        (["--param", "rl.lr=log:-1:1e-3"], "error: --param 'rl.lr=log:-1:1e-3': low: Input should be greater than 0"),
        ([], "error: nothing to search"),
        (["--param", "rl.lr=log:1e-5:1e-3", "rl.stepz=3"], "error: unknown config key 'rl.stepz'"),
        (["--param", "a=int:1:2", "--param", "a=int:1:3"], "error: --param 'a' is given twice"),
        (["--resume", "nowhere"], "error: cannot resume 'nowhere': it is not a sweep folder"),
        (["--resume", "x", "--param", "rl.lr=log:1e-5:1e-3"], "error: --resume continues the folder's own search"),
    ],
)
def test_cli_mistakes_exit_2_before_any_compute(tmp_path: Path, args: list[str], message: str) -> None:
    out = tmp_path / "sweep"
    where = [] if "--resume" in args else ["--out", str(out)]
    result = CliRunner().invoke(app, ["sweep", *where, *args])
    assert result.exit_code == 2, result.output
    assert result.output.strip().startswith(message), result.output  # no emoji made of ':-1:', no traceback
    assert len(result.output.strip().splitlines()) == 1
    assert not out.exists()  # nothing was made
