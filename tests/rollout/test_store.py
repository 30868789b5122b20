"""The rollout store gives back exactly the trajectories it was given; bad files are one-line errors."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from harmonyrl.rollout.show import episodes_text
from harmonyrl.rollout.store import RolloutFileError, list_steps, read_step, step_path, to_table, write_step
from harmonyrl.types import Failure, Message, Trajectory, Turn

CALL = Message("assistant", '{"expression": "17 * 23"}', "commentary", "functions.calculator", None, "json")
RESULT = Message("tool", '{"result": 391}', "commentary", "assistant", "functions.calculator")
FINAL = Message("assistant", "391", "final")


def _traj(**changes: object) -> Trajectory:
    base = Trajectory(
        task_id="train-0001",
        group_id=3,
        token_ids=(2, 9, 4, 700, 1023, 7),
        loss_mask=(0, 0, 0, 1, 1, 1),
        sampler_logprobs=(0.0, 0.0, 0.0, -0.1, -1e-300, -5e-324),
        reward=1.0,
        terminated=True,
        truncated=False,
        failure=None,
        turns=(Turn((CALL,), None, (RESULT,), 0.012345678901234567, 0.0031), Turn((FINAL,), None, (), 0.5, 1e-7)),
        parity_mismatches=0,
        reward_terms={"correct": 1.0, "format_error": 0.0, "tool_calls": 1.0},
        task_prompt="What is 17 * 23?",
        expected_answer="391",
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def _varied() -> list[Trajectory]:
    analysis = Message("assistant", "Rechnen: 17×23 — ✓ 你好 [bold]not markup[/] \n\t", "analysis")
    return [
        _traj(),
        _traj(
            group_id=0,
            reward=0.0,
            failure=Failure("tool_timeout", "calculator took > 5 s ✗"),
            turns=(Turn((analysis, CALL), None, (), 0.1, 5.0),),
            reward_terms={},
        ),
        _traj(
            reward=0.0,
            terminated=True,
            turns=(Turn((), "missing_end: no <|end|> after «x»", (), 0.2, 0.0),),
            reward_terms={"parse_error": 1.0},
            parity_mismatches=2,
        ),
        _traj(terminated=False, truncated=True, turns=(), token_ids=(), loss_mask=(), sampler_logprobs=()),
        _traj(sampler_logprobs=(-0.0, 1e308, -1e308, -2.2250738585072014e-308, -1 / 3, -math.pi), reward=-1e-320),
        _traj(task_id="τ-ü/1", group_id=2**40, reward_terms={"weird key ✓": 0.1 + 0.2}, expected_answer=""),
        _traj(
            turns=(Turn((CALL,), None, (RESULT,), 0.0, 0.0),) * 5,
            token_ids=tuple(range(1000)),
            loss_mask=(1,) * 1000,
            sampler_logprobs=tuple(-i / 7 for i in range(1000)),
        ),
    ]


def test_round_trip_is_exact_and_ordered(tmp_path: Path) -> None:
    trajs = _varied()
    path = step_path(tmp_path, 7)
    write_step(path, 7, trajs)
    back = read_step(path)
    assert back == trajs
    for a, b in zip(back, trajs, strict=True):  # bit-exact floats, not just ==
        assert [math.copysign(1, x) for x in a.sampler_logprobs] == [math.copysign(1, x) for x in b.sampler_logprobs]
        assert all(type(x) is int for x in a.token_ids)
    table = pq.read_table(path)
    assert table.column("step").to_pylist() == [7] * len(trajs)
    assert table.column("index").to_pylist() == list(range(len(trajs)))
    assert table.schema.field("token_ids").type == pa.list_(pa.int32())
    assert table.schema.field("loss_mask").type == pa.list_(pa.int8())


def test_empty_step_and_listing(tmp_path: Path) -> None:
    assert list_steps(tmp_path) == []
    write_step(step_path(tmp_path, 2), 2, [])
    write_step(step_path(tmp_path, 10), 10, [_traj()])
    (tmp_path / "rollouts" / "step_00011.parquet.tmp").write_bytes(b"half")  # a killed writer's leftover
    (tmp_path / "rollouts" / "episodes.jsonl").write_text("")
    assert read_step(step_path(tmp_path, 2)) == []
    assert list_steps(tmp_path) == [2, 10]
    assert step_path(tmp_path, 10).name == "step_00010.parquet"


def test_write_is_atomic_and_replaces(tmp_path: Path) -> None:
    path = step_path(tmp_path, 1)
    write_step(path, 1, [_traj()])
    with pytest.raises((pa.ArrowException, OverflowError)):
        write_step(path, 1, [_traj(token_ids=(2**40,), loss_mask=(1,), sampler_logprobs=(0.0,))])
    assert read_step(path) == [_traj()]  # the failed write left the good file alone, and no temp file
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]
    write_step(path, 1, [_traj(reward=0.5)])
    assert read_step(path) == [_traj(reward=0.5)]


def _one_line_error(path: Path) -> str:
    with pytest.raises(RolloutFileError) as info:
        read_step(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    return message


def test_missing_file(tmp_path: Path) -> None:
    assert "does not exist" in _one_line_error(step_path(tmp_path, 3))


def test_garbage_and_truncated_files(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"\x00\xffnot parquet at all\n" * 50)
    assert "not a readable parquet file" in _one_line_error(garbage)
    cut = tmp_path / "cut.parquet"
    write_step(cut, 1, _varied())
    cut.write_bytes(cut.read_bytes()[:-40])
    assert "not a readable parquet file" in _one_line_error(cut)


def test_missing_column_wrong_type_and_bad_json(tmp_path: Path) -> None:
    table = to_table(1, _varied())
    no_column = tmp_path / "no_column.parquet"
    pq.write_table(table.drop_columns(["sampler_logprobs", "turns"]), no_column)
    assert "lacks column(s) sampler_logprobs, turns" in _one_line_error(no_column)
    wrong_type = tmp_path / "wrong_type.parquet"
    i = table.schema.get_field_index("token_ids")
    pq.write_table(table.set_column(i, "token_ids", pa.array([["x"]] * table.num_rows)), wrong_type)
    assert "wrong type" in _one_line_error(wrong_type)
    bad_json = tmp_path / "bad_json.parquet"
    i = table.schema.get_field_index("turns")
    pq.write_table(table.set_column(i, "turns", pa.array(["[{"] * table.num_rows)), bad_json)
    assert "row 0 is corrupt" in _one_line_error(bad_json)
    nulls = tmp_path / "nulls.parquet"
    i = table.schema.get_field_index("reward")
    pq.write_table(table.set_column(i, "reward", pa.nulls(table.num_rows, pa.float64())), nulls)
    assert "missing values in column(s) reward" in _one_line_error(nulls)


def test_show_prints_tool_call_observation_reward_and_failure() -> None:
    text = episodes_text(_varied(), limit=3, step=7, width=120)
    assert "step 7: 3 of 7 episodes" in text
    assert "assistant<|channel|>commentary to=functions.calculator <|constrain|>json" in text
    assert '{"expression": "17 * 23"}' in text
    assert "functions.calculator<|channel|>commentary to=assistant" in text and '{"result": 391}' in text
    assert "reward 1 " in text and "correct=1" in text
    assert "failure tool_timeout: calculator took > 5 s ✗" in text
    assert "parse error: missing_end" in text
    assert "[bold]not markup[/]" in text  # model text is printed as written, not interpreted as rich markup
    assert "episode 3" not in text


def test_a_file_from_before_prompts_were_recorded_reads_with_none(tmp_path: Path) -> None:
    path = step_path(tmp_path, 1)
    table = to_table(1, [_traj()])
    path.parent.mkdir()
    pq.write_table(table.drop_columns(["task_prompt", "expected_answer"]), path)
    assert read_step(path) == [_traj(task_prompt="", expected_answer="")]


def test_show_prints_the_tasks_prompt_and_expected_answer() -> None:
    text = episodes_text([_traj(), _traj(expected_answer="")], limit=2, width=120)
    assert text.count("prompt: What is 17 * 23?") == 2
    assert text.count("expected answer: 391") == 1  # none for the task without one
    assert text.index("prompt: ") < text.index("turn 1") < text.index("reward 1 ") < text.index("correct=1")
