"""Accelerators a plan can be made for: a small table of public figures, and this machine measured.

Figures are the vendors' dense (no sparsity) peaks and memory bandwidths as published for the SXM/ OAM parts;
a plan applies stated utilisations to them (:mod:`harmonyrl.plan.estimate`). ``cpu`` is a placeholder for a
2-core laptop-class machine; :func:`calibrate` measures the one it runs on instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Hardware:
    """One device's figures."""

    name: str
    memory_gib: float
    """Memory a process can allocate on one device."""
    bf16_tflops: float
    """Dense bf16 matrix peak (TFLOP/s)."""
    fp32_tflops: float
    """Dense fp32 peak (TFLOP/s; tensor-core TF32 is not assumed)."""
    bandwidth_gbs: float
    """Memory bandwidth (GB/s)."""
    link_gbs: float
    """Device-to-device bandwidth within a node (GB/s, one direction)."""


HARDWARE: dict[str, Hardware] = {
    "h100": Hardware("h100", 80, 989.0, 67.0, 3350.0, 450.0),
    "h200": Hardware("h200", 141, 989.0, 67.0, 4800.0, 450.0),
    "b200": Hardware("b200", 180, 2250.0, 80.0, 8000.0, 900.0),
    "a100": Hardware("a100", 80, 312.0, 19.5, 2039.0, 300.0),
    "l40s": Hardware("l40s", 48, 362.0, 91.6, 864.0, 32.0),
    "cpu": Hardware("cpu", 24, 0.1, 0.1, 20.0, 10.0),
}
"""Shipped devices by name (``--hardware``)."""


class UnknownHardware(ValueError):
    """A hardware name the table does not have."""


def lookup(name: str) -> Hardware:
    """The table's entry for ``name`` (case-insensitive), or a one-line :class:`UnknownHardware`."""
    try:
        return HARDWARE[name.lower()]
    except KeyError:
        raise UnknownHardware(f"unknown hardware {name!r}; choose from {', '.join(HARDWARE)} or --calibrate") from None


def calibrate(seconds: float = 2.0, device: str = "cpu") -> Hardware:
    """``device`` on this machine, measured: matrix FLOP/s (a 1024² product, in fp32 and, on a GPU, bf16) and
    memory bandwidth (a 256 MiB copy), each the best of repeated runs within ``seconds``; memory is the host's
    ``MemAvailable`` or the GPU's total."""
    import torch

    def timed(fn: Callable[[], object]) -> float:
        def run() -> None:
            fn()
            if device == "cuda":
                torch.cuda.synchronize()

        return _best(run, seconds / 3)

    a, b = torch.randn(1024, 1024, device=device), torch.randn(1024, 1024, device=device)
    fp32 = 2 * 1024**3 / timed(lambda: a @ b)
    bf16 = fp32
    if device == "cuda":
        a16, b16 = a.bfloat16(), b.bfloat16()
        bf16 = 2 * 1024**3 / timed(lambda: a16 @ b16)
    src = torch.empty(64 << 20, device=device)  # 256 MiB of fp32
    dst = torch.empty_like(src)
    bandwidth = 2 * src.numel() * 4 / timed(lambda: dst.copy_(src))  # read and write
    if device == "cuda":
        memory = torch.cuda.get_device_properties(0).total_memory / 2**30
        name = f"{torch.cuda.get_device_name(0)} (measured)"
    else:
        memory, name = _mem_available_gib(), "this machine (measured)"
    return Hardware(name, memory, bf16 / 1e12, fp32 / 1e12, bandwidth / 1e9, bandwidth / 1e9)


def _best(fn: Callable[[], object], seconds: float) -> float:
    fn()
    best, end = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < end:
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _mem_available_gib() -> float:
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(fields["MemAvailable"].split()[0]) / 2**20
    except (OSError, KeyError, ValueError):
        return 0.0
