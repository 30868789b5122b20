"""The lossless rollout record: one parquet file per RL step (``RUN_DIR/rollouts/step_00001.parquet``).

``rollouts/episodes.jsonl`` (:mod:`harmonyrl.telemetry.episodes`) is for people and drops token ids and
log-probs; this file is for machines: :func:`read_step` rebuilds every :class:`Trajectory` *equal* to the one
trained on, in order, so ``harmonyrl replay`` can re-run the update without generating (bit-exact on CPU).

Design choices:

* One codec: a row is the plain record of :mod:`harmonyrl.trajectory_codec` laid out as columns, and every
  ``Trajectory`` field has its column (checked at import), so no field can be dropped here alone.
* Columnar, one row per episode. The token-level fields are typed list columns (``token_ids`` int32,
  ``loss_mask`` int8, ``sampler_logprobs`` float64); parquet stores doubles as their IEEE bits, so log-probs
  round-trip exactly (``-0.0``, subnormals and ±1e308 included), which a text format would only promise via
  ``repr``.
* The nested, variable-shaped parts (turns with their messages, reward terms) are JSON strings. They are
  small, rarely queried by column, and JSON keeps the schema flat. ``json.dumps`` writes floats with
  ``repr`` (exact) and escapes non-ASCII (so even lone surrogates from odd model output round-trip).
* MoE routing (``[T, L, k]`` int8/int16 expert ids, :class:`~harmonyrl.types.Routing`) is one binary cell of
  raw bytes plus its shape, null when the episode has none: ~T·L·k bytes, no per-element list overhead.
* Atomic: the table is written to ``*.tmp``, fsynced and renamed into place, so a killed run leaves either
  the whole step or none of it. A resumed run rewrites the steps after its checkpoint with identical content.
* Reading is strict: a missing file, a non-parquet file, a missing column or a value of the wrong type is a
  :class:`RolloutFileError` whose one-line message names the file.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]  # no stubs or py.typed
import pyarrow.parquet as pq  # type: ignore[import-untyped]
import torch

from harmonyrl.trajectory_codec import TRAJECTORY_FIELDS, Plain, trajectory_from_plain, trajectory_to_plain
from harmonyrl.types import Trajectory

FORMAT_VERSION = "1"
SCHEMA = pa.schema(
    [
        ("step", pa.int64()),
        ("index", pa.int64()),
        ("task_id", pa.string()),
        ("group_id", pa.int64()),
        ("token_ids", pa.list_(pa.int32())),
        ("loss_mask", pa.list_(pa.int8())),
        ("sampler_logprobs", pa.list_(pa.float64())),
        ("reward", pa.float64()),
        ("terminated", pa.bool_()),
        ("truncated", pa.bool_()),
        ("failure_kind", pa.string()),
        ("failure_detail", pa.string()),
        ("parity_mismatches", pa.int64()),
        ("reward_terms", pa.string()),
        ("turns", pa.string()),
        ("routing", pa.binary()),
        ("routing_shape", pa.list_(pa.int64())),
        ("policy_version", pa.int64()),
        ("task_prompt", pa.string()),
        ("expected_answer", pa.string()),
        ("token_versions", pa.list_(pa.int64())),
    ],
    metadata={"harmonyrl.rollout_format": FORMAT_VERSION},
)
_OPTIONAL = frozenset(
    {"routing", "routing_shape", "policy_version", "task_prompt", "expected_answer", "token_versions"}
)
"""Columns added after format 1 shipped: files without them read as episodes without routing, of version 0, with no
task prompt or expected answer, sampled by one version (``token_versions`` is also null when empty)."""
_NULLABLE = frozenset({"failure_kind", "failure_detail"}) | _OPTIONAL
_SPLIT = {"failure_kind": "failure", "failure_detail": "failure", "routing_shape": "routing"}
"""Columns that hold part of a field (the codec's ``failure`` pair, routing's shape beside its bytes)."""
if {_SPLIT.get(n, n) for n in SCHEMA.names[2:]} != set(TRAJECTORY_FIELDS):  # pragma: no cover - at import
    raise ImportError("the rollout store's columns must hold exactly the Trajectory fields (trajectory_codec)")
_ROUTING_DTYPES = {1: torch.int8, 2: torch.int16}
"""Routing ids are stored as their raw little-endian bytes; the item size tells int8 from int16."""
_STEP_FILE = re.compile(r"^step_(\d+)\.parquet$")


class RolloutFileError(ValueError):
    """A rollout file that is missing, not parquet, or not a harmonyrl rollout record (message: one line)."""


def step_path(run_dir: Path, step: int) -> Path:
    """Where RL step ``step`` (1-based, as in ``metrics.jsonl``) is recorded."""
    return Path(run_dir) / "rollouts" / f"step_{step:05d}.parquet"


def list_steps(run_dir: Path) -> list[int]:
    """The recorded RL steps of ``run_dir``, ascending (empty if none; half-written ``*.tmp`` files ignored)."""
    folder = Path(run_dir) / "rollouts"
    if not folder.is_dir():
        return []
    return sorted(int(m.group(1)) for p in folder.iterdir() if (m := _STEP_FILE.match(p.name)))


# ---------------------------------------------------------------- write


def _column(name: str, plain: list[Plain]) -> list[Any]:
    """Column ``name`` of the rows, from the codec's plain records (JSON where the value is nested)."""
    if name in ("turns", "reward_terms"):
        return [json.dumps(p[name]) for p in plain]
    if name in ("failure_kind", "failure_detail"):
        return [None if p["failure"] is None else p["failure"][name == "failure_detail"] for p in plain]
    if name == "routing":
        return [None if p["routing"] is None else _routing_bytes(p["routing"]) for p in plain]
    if name == "routing_shape":
        return [None if p["routing"] is None else list(p["routing"].shape) for p in plain]
    if name == "token_versions":  # empty unless a partial rollout spanned versions: null, as in older files
        return [p[name] or None for p in plain]
    return [p[name] for p in plain]


def to_table(step: int, trajectories: Sequence[Trajectory]) -> pa.Table:
    """The step's episodes as one arrow table (row ``i`` is ``trajectories[i]``)."""
    plain = [trajectory_to_plain(t) for t in trajectories]
    columns = {"step": [step] * len(plain), "index": list(range(len(plain)))}
    columns |= {name: _column(name, plain) for name in SCHEMA.names[2:]}
    return pa.Table.from_pydict(columns, schema=SCHEMA)


def _routing_bytes(ids: torch.Tensor) -> bytes:
    if ids.dtype not in _ROUTING_DTYPES.values():
        raise ValueError(f"routing ids must be int8 or int16, got {ids.dtype}")
    return ids.contiguous().numpy().astype(f"<i{ids.element_size()}").tobytes()


def _routing(blob: bytes | None, shape: list[int] | None) -> torch.Tensor | None:
    if blob is None or shape is None:
        if (blob is None) != (shape is None):
            raise ValueError("routing and routing_shape must both be set or both be null")
        return None
    count = math.prod(shape)
    size = len(blob) // count if count else 1
    if size not in _ROUTING_DTYPES or size * count != len(blob):
        raise ValueError(f"routing of {len(blob)} bytes does not fit shape {shape}")
    native = np.frombuffer(blob, dtype=f"<i{size}").astype(f"=i{size}")  # a copy, in host byte order
    return torch.from_numpy(native).view(shape)


def write_step(path: Path, step: int, trajectories: Sequence[Trajectory]) -> None:
    """Write one RL step's episodes to ``path`` atomically (parents created; an existing file is replaced)."""
    path = Path(path)
    table = to_table(step, trajectories)  # build first: a bad value must not leave a temp file behind
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with tmp.open("wb") as fh:
            pq.write_table(table, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


# ---------------------------------------------------------------- read


def _row(row: dict[str, Any]) -> Trajectory:
    """The trajectory of one row: its columns back into the codec's plain record."""
    kind, detail = row["failure_kind"], row["failure_detail"]
    plain = {name: row[name] for name in TRAJECTORY_FIELDS if name in row and row[name] is not None}
    plain |= {
        "failure": None if kind is None else [kind, detail],
        "turns": json.loads(row["turns"]),
        "reward_terms": json.loads(row["reward_terms"]),
        "routing": _routing(row["routing"], row["routing_shape"]),
    }
    return trajectory_from_plain(plain)  # a null optional column reads as the field's default


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def read_table(path: Path) -> pa.Table:
    """The step's table with :data:`SCHEMA` (extra columns dropped), or a :class:`RolloutFileError`."""
    path = Path(path)
    if not path.is_file():
        raise RolloutFileError(f"rollout file '{path}' does not exist")
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as e:
        raise RolloutFileError(f"rollout file '{path}' is not a readable parquet file: {_first_line(e)}") from e
    for name in _OPTIONAL - set(table.column_names):
        table = table.append_column(name, pa.nulls(table.num_rows, SCHEMA.field(name).type))
    missing = [name for name in SCHEMA.names if name not in table.column_names]
    if missing:
        raise RolloutFileError(f"rollout file '{path}' lacks column(s) {', '.join(missing)}")
    try:
        table = table.select(SCHEMA.names).cast(SCHEMA)
    except (pa.ArrowException, ValueError) as e:
        raise RolloutFileError(f"rollout file '{path}' has a column of the wrong type: {_first_line(e)}") from e
    nulls = [n for n in SCHEMA.names if n not in _NULLABLE and table.column(n).null_count]
    if nulls:
        raise RolloutFileError(f"rollout file '{path}' has missing values in column(s) {', '.join(nulls)}")
    return table


def read_step(path: Path) -> list[Trajectory]:
    """The trajectories of one step file, equal to the ones written and in the same order."""
    table = read_table(path)
    rows = sorted(table.to_pylist(), key=lambda r: r["index"])
    trajs: list[Trajectory] = []
    for row in rows:
        try:
            trajs.append(_row(row))
        except (KeyError, TypeError, ValueError) as e:  # ValueError covers json.JSONDecodeError
            where = f"row {row['index']}"
            raise RolloutFileError(f"rollout file '{path}' {where} is corrupt: {_first_line(e)}") from e
    return trajs
