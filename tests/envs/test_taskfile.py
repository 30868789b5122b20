"""JSONL task files (schema, file:line errors) and prefix-stable split generation shared by the factories."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from harmonyrl.envs.checker import check_env
from harmonyrl.envs.taskfile import TaskFileError, draw_splits, load_tasks_jsonl, read_tasks_jsonl
from harmonyrl.tasks.sql import SqlFactory, answer_of
from harmonyrl.types import Task

ROWS: list[dict[str, str | int]] = [
    {"id": "a", "prompt": "How many orders were placed in 2023?", "answer": "200", "split": "train"},
    {"id": "b", "prompt": "How many customers are there?", "answer": 60, "split": "test"},
    {"id": "c", "prompt": "How many products are there?", "answer": "30", "split": "train"},
]


def write(tmp_path: Path, lines: list[str] | bytes) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_bytes(lines if isinstance(lines, bytes) else "\n".join(lines).encode())
    return path


def test_loads_each_split_in_file_order(tmp_path: Path) -> None:
    path = write(tmp_path, [json.dumps(ROWS[0]), "", "   ", json.dumps(ROWS[1]), json.dumps(ROWS[2])])
    assert load_tasks_jsonl(path, "train") == [
        Task("a", "How many orders were placed in 2023?", "200", "train"),
        Task("c", "How many products are there?", "30", "train"),
    ]
    assert load_tasks_jsonl(str(path), "test") == [Task("b", "How many customers are there?", "60", "test")]
    with pytest.raises(ValueError, match="split must be 'train', 'validation' or 'test'"):
        load_tasks_jsonl(path, "valid")  # type: ignore[arg-type]


def row(**changes: object) -> str:
    return json.dumps({**ROWS[0], **changes})


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", r"tasks.jsonl:2: not valid JSON \(Expecting property name"),
        ("[1, 2]", "tasks.jsonl:2: expected a JSON object, got list"),
        (json.dumps({"id": "x", "prompt": "p"}), r"tasks.jsonl:2: missing key\(s\) \['answer', 'split'\]"),
        (row(id="x", anwser="1"), r"tasks.jsonl:2: unknown key\(s\) \['anwser'\]"),
        (
            row(id="x", prompt="q", split="valid"),
            'tasks.jsonl:2: \'split\' must be "train", "validation" or "test", got \'valid\'',
        ),
        (row(id="x", prompt="q", answer=1.5), "tasks.jsonl:2: 'answer' must be a non-empty string, got 1.5"),
        (row(id="x", prompt="q", answer=True), "tasks.jsonl:2: 'answer' must be a non-empty string, got True"),
        (row(id=7, prompt="q"), "tasks.jsonl:2: 'id' must be a non-empty string, got 7"),
        (row(id="x", prompt=" "), "tasks.jsonl:2: 'prompt' must be a non-empty string"),
        (row(prompt="q"), r"tasks.jsonl:2: duplicate id 'a' \(first on line 1\)"),
        (row(id="x", split="test"), r"tasks.jsonl:2: prompt is also in the train split \(line 1\): a leaked problem"),
    ],
)
def test_bad_lines_name_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = write(tmp_path, [json.dumps(ROWS[0]), line])
    with pytest.raises(TaskFileError, match=message) as caught:
        load_tasks_jsonl(path, "train")
    assert str(caught.value).startswith(f"{path}:2: ") and "\n" not in str(caught.value)


def test_unreadable_and_non_utf8_files(tmp_path: Path) -> None:
    with pytest.raises(TaskFileError, match=r"missing.jsonl: cannot read task file \(No such file or directory\)"):
        read_tasks_jsonl(tmp_path / "missing.jsonl")
    path = write(tmp_path, json.dumps(ROWS[0]).encode() + b"\n\xff\xfe\n")
    with pytest.raises(TaskFileError, match=r"tasks.jsonl:2: not UTF-8 \(invalid start byte at byte 0\)"):
        read_tasks_jsonl(path)


def test_a_factory_runs_on_a_task_file(tmp_path: Path) -> None:
    """The answers of a user's own questions over the shop database, checked like any built-in env."""
    questions = {
        "How many orders are there?": "SELECT COUNT(*) FROM orders",
        "How many customers live in Lyon?": "SELECT COUNT(*) FROM customers WHERE city = 'Lyon'",
        "How many units were sold in 2023?": "SELECT SUM(quantity) FROM orders WHERE year = 2023",
    }
    rows = [
        {"id": f"q{i}", "prompt": p, "answer": answer_of(sql), "split": "test" if i == 2 else "train"}
        for i, (p, sql) in enumerate(questions.items())
    ]
    path = write(tmp_path, [json.dumps(r) for r in rows])
    factory = SqlFactory(tasks_file=path)
    assert [t.id for t in factory.tasks("train")] == ["q0", "q1"] and [t.id for t in factory.tasks("test")] == ["q2"]
    assert factory.tasks("train")[0].answer == "800"
    assert [t.id for t in SqlFactory(tasks_file=path, n_train=1).tasks("train")] == ["q0"]  # n_* cap the file
    assert check_env(factory, rebuild=lambda: SqlFactory(tasks_file=path)) == []


def _draw(r: random.Random) -> tuple[str, Callable[[], tuple[str, str]]]:
    a, b = r.randint(1, 40), r.randint(1, 40)
    key = f"{min(a, b)}+{max(a, b)}"
    return key, lambda: (f"What is {a} + {b}?", str(a + b))


def test_draw_splits_is_deterministic_prefix_stable_and_disjoint() -> None:
    train, test = draw_splits("toy", 3, 100, 10, _draw)
    assert (train, test) == draw_splits("toy", 3, 100, 10, _draw)
    small = draw_splits("toy", 3, 30, 4, _draw)
    assert small == (train[:30], test[:4])
    assert train[0].id == "toy-3-train-00000" and test[-1].id == "toy-3-test-00009"

    def key(t: Task) -> str:
        a, b = sorted(int(x) for x in t.prompt[8:-1].split(" + "))
        return f"{a}+{b}"

    other = draw_splits("toy", 4, 100, 10, _draw)
    assert not {key(t) for t in (*train, *other[0])} & {key(t) for t in (*test, *other[1])}
    with pytest.raises(ValueError, match="toy: could not draw 900 train \\+ 10 test distinct problems"):
        draw_splits("toy", 3, 900, 10, _draw)  # only 820 distinct keys exist


def test_too_many_problems_for_the_settings_is_a_one_line_cli_error(tmp_path: Path) -> None:
    """A 3x3 maze has fewer than 300 distinct problems: the command says which knobs to turn, no traceback."""
    from typer.testing import CliRunner

    from harmonyrl.cli import app

    args = ["train", "env.name=maze", "env.size=3", "env.n_train=200", f"output_dir={tmp_path}", "run_name=m"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "maze: could not draw 200 train + 100 test distinct problems" in result.output
    assert "lower env.n_train / env.n_test" in result.output and "unexpected error" not in result.output
    assert not (tmp_path / "m").exists()  # a run that failed before its first step leaves no folder


def test_validation_rows_or_a_carve_of_the_train_rows(tmp_path: Path) -> None:
    from harmonyrl.envs.taskfile import carved, split_file

    rows = [
        {"id": f"t{i}", "prompt": f"How many orders in {1900 + i}?", "answer": "1", "split": "train"} for i in range(60)
    ]
    rows[5]["split"], rows[7]["split"] = "validation", "test"
    tasks = read_tasks_jsonl(write(tmp_path, [json.dumps(r) for r in rows]))
    own = split_file(tasks, 100, 100, 100)  # the file's own validation rows, train untouched
    assert ([t.id for t in own.validation], [t.id for t in own.test], len(own.train)) == (["t5"], ["t7"], 58)
    old = split_file([t for t in tasks if t.split != "validation"], 100, 100, 100)  # a file without: carved
    assert old.validation and all(t.split == "validation" and carved(t.prompt) for t in old.validation)
    assert not any(carved(t.prompt) for t in old.train) and len(old.train) + len(old.validation) == 58
    assert not {t.prompt for t in old.train} & {t.prompt for t in old.validation}
    assert len(split_file(tasks, 3, 0, 1).train) == 3 and not split_file(tasks, 3, 0, 1).validation  # n_* cap it
    leaked = [*rows, {**rows[5], "id": "again", "split": "train"}]  # a validation prompt also in train
    with pytest.raises(TaskFileError, match="prompt is also in the validation split"):
        read_tasks_jsonl(write(tmp_path, [json.dumps(r) for r in leaked]))
