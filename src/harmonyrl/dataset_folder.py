"""A Hugging Face ``datasets`` folder (``save_to_disk``) read as plain rows: the third form, beside JSONL and
parquet, of demonstration files (``sft.demos``) and preference pairs (``harmonyrl rm``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


class DatasetFolderError(ValueError):
    """The folder cannot be read as a dataset: the one-line reason (callers prefix the setting)."""


def dataset_folder_rows(path: Path, columns: Sequence[str]) -> tuple[list[str], list[dict[str, object]]]:
    """The ``train`` split (or the only dataset) saved at ``path``: every column name, and its rows restricted to
    ``columns``. Raises :class:`DatasetFolderError` when ``datasets`` is missing or the folder is not one."""
    try:
        import datasets
    except ImportError:
        raise DatasetFolderError(
            f"'{path}' is a folder, read with Hugging Face datasets, which is not installed: "
            "pip install 'harmonyrl[data]'"
        ) from None
    try:
        loaded = datasets.load_from_disk(str(path))
    except FileNotFoundError as e:
        raise DatasetFolderError(f"'{path}' is not a folder saved with datasets' save_to_disk: {e}") from None
    if isinstance(loaded, datasets.DatasetDict):
        if "train" not in loaded:
            raise DatasetFolderError(f"'{path}' has no 'train' split (splits: {', '.join(loaded)})")
        loaded = loaded["train"]
    names = list(loaded.column_names)
    kept = loaded.select_columns([c for c in columns if c in names])
    return names, [dict(row) for row in kept.to_list()]
