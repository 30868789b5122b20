"""Reading preference pairs from a file: JSONL (one pair a line), parquet, or a Hugging Face ``datasets`` folder saved
with ``save_to_disk`` (its ``train`` split), as ``sft.demos`` files are read (sft/demo_files.py). Every row that
is not a pair is kept as a :class:`PairIssue` naming file and line (row for tables), and counted; a file that cannot
be read at all, or holds no usable pair, is a one-line :class:`PairFileError`."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from harmonyrl.dataset_folder import DatasetFolderError, dataset_folder_rows
from harmonyrl.rewards.pairs import Pair, PairFormatError, parse_pair

COLUMNS = ("prompt", "chosen", "rejected", "margin")
SHOWN = 5
"""Issues shown in the summary line; :attr:`PairFile.issues` has them all."""


class PairFileError(ValueError):
    """A preference file that cannot be used: one line naming the file."""


@dataclass(frozen=True)
class PairIssue:
    """A row that is not a pair: where (``file:line 3`` or ``file:row 2``) and why."""

    file: str
    unit: str
    """``"line"`` (JSONL, 1-based) or ``"row"`` (parquet or datasets, 0-based)."""
    number: int
    reason: str

    def __str__(self) -> str:
        return f"{self.file}:{self.unit} {self.number}: {self.reason}"


@dataclass(frozen=True)
class PairFile:
    pairs: tuple[Pair, ...]
    issues: tuple[PairIssue, ...]

    def summary(self) -> str:
        """``pairs: 480 used, 3 skipped (2 chosen and rejected are identical, 1 …); first: f.jsonl:line 4: …``"""
        line = f"pairs: {len(self.pairs)} used, {len(self.issues)} skipped"
        if self.issues:
            causes = Counter(i.reason for i in self.issues)
            line += " (" + ", ".join(f"{n} {why}" for why, n in causes.most_common(SHOWN)) + ")"
            line += "; first: " + "; ".join(str(i) for i in self.issues[:SHOWN])
        return line


def read_pairs(path: Path) -> PairFile:
    """The pairs of ``path`` and every bad row; :class:`PairFileError` if nothing in it is usable."""
    if not path.exists():
        raise PairFileError(f"preference file '{path}' does not exist")
    if path.is_dir():
        unit, rows = "row", _dataset_rows(path)
    elif path.suffix in (".jsonl", ".json"):
        unit, rows = "line", _jsonl_rows(path)
    elif path.suffix == ".parquet":
        unit, rows = "row", _parquet_rows(path)
    else:
        raise PairFileError(f"'{path}' is not a .jsonl or .parquet file or a folder saved with datasets' save_to_disk")
    pairs: list[Pair] = []
    issues: list[PairIssue] = []
    for number, row in rows:
        try:
            if isinstance(row, PairFormatError):
                raise row
            pairs.append(parse_pair(row))
        except PairFormatError as e:
            issues.append(PairIssue(str(path), unit, number, str(e)))
    result = PairFile(tuple(pairs), tuple(issues))
    if not pairs:
        raise PairFileError(f"'{path}' holds no usable preference pair ({result.summary()})")
    return result


def _jsonl_rows(path: Path) -> list[tuple[int, object]]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise PairFileError(f"cannot read '{path}': {e}") from None
    rows: list[tuple[int, object]] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append((number, json.loads(line)))
        except json.JSONDecodeError as e:
            rows.append((number, PairFormatError(f"invalid JSON ({e.msg})")))
    return rows


def _parquet_rows(path: Path) -> list[tuple[int, object]]:
    import pyarrow as pa  # type: ignore[import-untyped]  # no stubs or py.typed
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    try:
        names = pq.read_schema(path).names
        table = pq.read_table(path, columns=[c for c in COLUMNS if c in names])
    except (pa.ArrowException, OSError) as e:
        raise PairFileError(f"'{path}' is not a readable parquet file: {e}") from None
    return list(enumerate(table.to_pylist()))


def _dataset_rows(path: Path) -> list[tuple[int, object]]:
    try:
        _, rows = dataset_folder_rows(path, COLUMNS)
    except DatasetFolderError as e:
        raise PairFileError(str(e)) from None
    return list(enumerate(rows))


def write_pairs_jsonl(rows: list[dict[str, object]], path: Path) -> None:
    """Write rows as JSONL (parents created), atomically: a temp file renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    tmp.replace(path)
