"""MoE routing survives the rollout store: int8 and int16, with and without, and old files without it."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from harmonyrl.rollout.store import RolloutFileError, read_step, step_path, to_table, write_step
from harmonyrl.types import Routing, Trajectory


def _traj(routing: Routing | None) -> Trajectory:
    return Trajectory(
        task_id="t", group_id=0, token_ids=(2, 9, 4, 7), loss_mask=(0, 0, 1, 1),
        sampler_logprobs=(0.0, 0.0, -0.5, -0.25), reward=1.0, terminated=True, truncated=False,
        failure=None, turns=(), routing=routing,
    )  # fmt: skip


def test_routing_round_trips_exactly(tmp_path: Path) -> None:
    small = torch.tensor([[[0, 3], [1, 2]], [[3, 0], [-1, -1]], [[1, 2], [2, 1]], [[-1, -1], [-1, -1]]])
    wide = torch.tensor([[[200, -1]], [[0, 32767]], [[127, 128]], [[5, 6]]], dtype=torch.int16)
    trajs = [_traj(Routing(small.to(torch.int8))), _traj(None), _traj(Routing(wide))]
    path = step_path(tmp_path, 1)
    write_step(path, 1, trajs)
    back = read_step(path)
    assert back == trajs  # Routing compares values, dtype and shape
    assert back[0].routing is not None and back[0].routing.ids.dtype == torch.int8
    assert back[2].routing is not None and back[2].routing.ids.dtype == torch.int16
    assert back[1].routing is None
    # one byte per id for int8: the cell is T·L·k bytes
    assert len(pq.read_table(path).column("routing")[0].as_py()) == small.numel()


def test_files_written_before_routing_existed_still_read(tmp_path: Path) -> None:
    path = tmp_path / "old.parquet"
    pq.write_table(to_table(1, [_traj(None)]).drop_columns(["routing", "routing_shape"]), path)
    assert read_step(path) == [_traj(None)]


def test_corrupt_routing_is_a_one_line_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.parquet"
    table = to_table(1, [_traj(Routing(torch.zeros(4, 2, 2, dtype=torch.int8)))])
    shape = table.schema.get_field_index("routing_shape")
    bad = table.set_column(shape, "routing_shape", [[[4, 2, 3]]])  # 16 bytes do not fit 4·2·3 ids
    pq.write_table(bad, path)
    with pytest.raises(RolloutFileError, match="row 0 is corrupt: routing of 16 bytes does not fit"):
        read_step(path)
