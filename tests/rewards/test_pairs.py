"""Preference files: TRL's plain and conversational rows, margins; every bad row counted with its file and line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harmonyrl.rewards.pair_files import PairFileError, read_pairs
from harmonyrl.rewards.pairs import PairFormatError, parse_pair
from harmonyrl.types import Message


def test_plain_text_row() -> None:
    pair = parse_pair({"prompt": "Describe the sea.", "chosen": "Waves.", "rejected": "No.", "margin": 2})
    assert pair.prompt == (Message(role="user", content="Describe the sea."),)
    assert pair.chosen == (Message(role="assistant", channel="final", content="Waves."),)
    assert pair.margin == 2.0


def test_conversational_row() -> None:
    row = {
        "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        "chosen": [{"role": "assistant", "content": "think"}, {"role": "assistant", "content": "Hello!"}],
        "rejected": [{"role": "assistant", "content": "Go away."}],
    }
    pair = parse_pair(row)
    assert [m.role for m in pair.prompt] == ["system", "user"]
    assert [m.channel for m in pair.chosen] == ["analysis", "final"]  # the last answer message is the final one
    assert pair.margin == 0.0


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ({"prompt": "p", "chosen": "same", "rejected": "same"}, "identical"),
        ({"prompt": "p", "chosen": "a"}, "missing 'rejected'"),
        ({"chosen": "a", "rejected": "b"}, "missing 'prompt'"),
        ({"prompt": "p", "chosen": "a", "rejected": "b", "margin": "big"}, "margin"),
        ({"prompt": "p", "chosen": "a", "rejected": "b", "margin": float("nan")}, "margin"),
        ({"prompt": "p", "chosen": [{"role": "user", "content": "a"}], "rejected": "b"}, "role"),
        ({"prompt": "p", "chosen": 3, "rejected": "b"}, "string or a non-empty list"),
        ([1, 2], "expected an object"),
    ],
)
def test_bad_rows_are_format_errors(row: object, reason: str) -> None:
    with pytest.raises(PairFormatError, match=reason):
        parse_pair(row)


def test_jsonl_bad_lines_counted_by_line(tmp_path: Path) -> None:
    path = tmp_path / "pairs.jsonl"
    lines = [
        json.dumps({"prompt": "p", "chosen": "a", "rejected": "b"}),
        "{not json",
        "",
        json.dumps({"prompt": "p", "chosen": "a", "rejected": "a"}),
        json.dumps({"prompt": "q", "chosen": "c", "rejected": "d", "extra": 1}),
    ]
    path.write_text("\n".join(lines) + "\n")
    got = read_pairs(path)
    assert len(got.pairs) == 2
    assert [(i.unit, i.number) for i in got.issues] == [("line", 2), ("line", 4)]
    assert "2 used, 2 skipped" in got.summary() and f"{path}:line 4: chosen and rejected are identical" in got.summary()


def test_parquet_rows(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"prompt": ["p", "q"], "chosen": ["a", "x"], "rejected": ["b", "x"], "margin": [1.0, None]})
    pq.write_table(table, tmp_path / "pairs.parquet")
    got = read_pairs(tmp_path / "pairs.parquet")
    assert [p.margin for p in got.pairs] == [1.0] and [(i.unit, i.number) for i in got.issues] == [("row", 1)]


def test_datasets_folder(tmp_path: Path) -> None:
    import datasets

    datasets.Dataset.from_list([{"prompt": "p", "chosen": "a", "rejected": "b"}]).save_to_disk(tmp_path / "ds")
    assert len(read_pairs(tmp_path / "ds").pairs) == 1


def test_unusable_files_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(PairFileError, match="does not exist"):
        read_pairs(tmp_path / "none.jsonl")
    (tmp_path / "x.txt").write_text("hi")
    with pytest.raises(PairFileError, match=r"is not a \.jsonl"):
        read_pairs(tmp_path / "x.txt")
    (tmp_path / "bad.jsonl").write_text('{"prompt": "p"}\n')
    with pytest.raises(PairFileError, match="holds no usable preference pair"):
        read_pairs(tmp_path / "bad.jsonl")
