"""The one tensor-holding type, :class:`~harmonyrl.types.Routing`, formats in O(1): Python formats results nobody
asked to see (``asyncio.run`` repr()s its finished task, result included, whenever it restores the SIGINT
handler), and formatting a routing tensor read every value back, a device sync each on CUDA."""

from __future__ import annotations

import asyncio
import signal

import pytest
import torch

from harmonyrl.types import Generation, Routing


@pytest.fixture
def tensor_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts values read back from tensors (counted, not refused: reprlib swallows a formatter's exception)."""
    reads = [0]
    item, tolist = torch.Tensor.item, torch.Tensor.tolist

    def counted(real: object) -> object:
        def read(self: torch.Tensor, *args: object) -> object:
            reads[0] += 1
            return real(self, *args)  # type: ignore[operator]

        return read

    monkeypatch.setattr(torch.Tensor, "item", counted(item))
    monkeypatch.setattr(torch.Tensor, "tolist", counted(tolist))
    return reads


def test_routing_repr_names_shape_and_dtype_only(tensor_reads: list[int]) -> None:
    routing = Routing(torch.zeros(300, 24, 4, dtype=torch.int8))
    assert repr(routing) == "Routing(ids=<300x24x4 int8>)"
    assert "routing=Routing(ids=<300x24x4 int8>)" in repr(Generation((1,), (-0.5,), "length", routing))
    assert tensor_reads == [0]


def test_asyncio_run_returning_generations_reads_no_routing_value(tensor_reads: list[int]) -> None:
    async def generations() -> list[Generation]:
        return [Generation((1, 2), (-0.5, -0.25), "length", Routing(torch.ones(2, 3, 4, dtype=torch.int8)))] * 8

    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a plain script: asyncio then installs
    try:  # its own handler, and formats the finished task when it checks that the handler is still its own
        assert len(asyncio.run(generations())) == 8
    finally:
        signal.signal(signal.SIGINT, before)
    assert tensor_reads == [0]
