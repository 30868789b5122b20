"""Reading an ``sft.demos`` file into rows: JSONL (one conversation a line), parquet, or a Hugging Face
``datasets`` folder saved with ``save_to_disk``. Each row keeps where it came from, so every problem with it can
be reported by file and line (row for tables). Checking a row against the schema is the caller's job."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from harmonyrl.dataset_folder import DatasetFolderError, dataset_folder_rows
from harmonyrl.errors import DemoFileError

COLUMNS = ("task_id", "messages")
"""The columns of a table that make a conversation; the dataset's other columns are not read."""


@dataclass(frozen=True)
class Row:
    """One conversation as read: ``value`` (a JSON object) or the reason it could not be read (``error``)."""

    unit: str
    """``"line"`` (JSONL, 1-based) or ``"row"`` (parquet or datasets, 0-based as ``dataset[i]``)."""
    number: int
    value: object = None
    error: str | None = None


def read_rows(path: Path) -> list[Row]:
    """The rows of ``path`` by its kind; a file that cannot be read as a whole is a one-line ``DemoFileError``."""
    if not path.exists():
        raise DemoFileError(f"sft.demos: '{path}' does not exist")
    if path.is_dir():
        return _table_rows(path, _dataset_rows(path))
    if path.suffix in (".jsonl", ".json"):
        return _jsonl_rows(path)
    if path.suffix == ".parquet":
        return _table_rows(path, _parquet_rows(path))
    raise DemoFileError(
        f"sft.demos: '{path}' is not a demonstrations file: expected a .jsonl or .parquet file or a folder saved "
        "with datasets' save_to_disk"
    )


def _jsonl_rows(path: Path) -> list[Row]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise DemoFileError(f"sft.demos: '{path}' is not UTF-8 text: {e}") from None
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue  # a blank line holds no conversation
        try:
            rows.append(Row("line", number, json.loads(line)))
        except json.JSONDecodeError as e:
            rows.append(Row("line", number, error=f"invalid JSON: {e}"))
    return rows


def _table_rows(path: Path, table: tuple[Sequence[str], list[dict[str, object]]]) -> list[Row]:
    columns, rows = table
    if "messages" not in columns:
        raise DemoFileError(f"sft.demos: '{path}' has no 'messages' column (columns: {', '.join(columns) or 'none'})")
    return [Row("row", i, row) for i, row in enumerate(rows)]


def _parquet_rows(path: Path) -> tuple[Sequence[str], list[dict[str, object]]]:
    import pyarrow as pa  # type: ignore[import-untyped]  # no stubs or py.typed
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    try:
        names = pq.read_schema(path).names
        table = pq.read_table(path, columns=[c for c in COLUMNS if c in names])
    except (pa.ArrowException, OSError) as e:
        raise DemoFileError(f"sft.demos: '{path}' is not a readable parquet file: {e}") from None
    return names, table.to_pylist()


def _dataset_rows(path: Path) -> tuple[Sequence[str], list[dict[str, object]]]:
    try:
        return dataset_folder_rows(path, COLUMNS)
    except DatasetFolderError as e:
        raise DemoFileError(f"sft.demos: {e}") from None
