"""The learner sharded over 2 processes (FSDP2 over gloo) updates exactly as one process does.

``fsdp_worker.py`` runs each RL config of its ``CASES`` and one SFT step, once as a single process and once under
``torchrun --nproc_per_node 2``; the losses, gradient norms, every other metric and the weights after the step
must agree within fp32 rounding. What differs between the two is only the order of the sums (each rank sums its
rows, the gradients are summed across ranks) and the single process scoring the shared prompt prefix once.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

WORKER = Path(__file__).with_name("fsdp_worker.py")
TIMEOUT_S = 600  # a 2-process launch takes ~15 s on an idle 2-core machine; the CPU is shared with other jobs
EXACT_IN_BOTH = ("train/episodes", "train/tokens", "train/dropped_zero_var", "train/masked_failures", "guard/")


def _run(out: Path, processes: int) -> dict[str, Any]:
    src = Path(__file__).resolve().parents[2] / "src"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}  # fmt: skip
    launcher = [sys.executable] if processes == 1 else [sys.executable, "-m", "torch.distributed.run",
                                                         "--nproc_per_node", str(processes)]  # fmt: skip
    done = subprocess.run([*launcher, str(WORKER), str(out)], env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(torch.load(out / f"world{processes}.pt", weights_only=False))


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, Any]]:
    out = tmp_path_factory.mktemp("fsdp")
    return _run(out, 1), _run(out, 2)


@pytest.mark.parametrize("case", ["default", "two_epochs_two_minibatches", "one_row_minibatches", "sft"])
def test_two_processes_update_as_one(results: tuple[dict[str, Any], dict[str, Any]], case: str) -> None:
    one, two = results[0][case], results[1][case]
    assert set(one["metrics"]) == set(two["metrics"])
    for name, value in one["metrics"].items():
        if name.startswith(EXACT_IN_BOTH):
            assert two["metrics"][name] == value, name
        else:  # fp32 sums in another order; the ratio's deviation is ~1e-7 where the single process has exactly 0
            assert math.isclose(two["metrics"][name], value, rel_tol=1e-5, abs_tol=1e-5), name
    loss = "sft/loss" if case == "sft" else "train/loss"
    assert math.isclose(two["metrics"][loss], one["metrics"][loss], rel_tol=1e-6)
    if case != "sft":
        assert math.isclose(two["metrics"]["train/grad_norm"], one["metrics"]["train/grad_norm"], rel_tol=1e-6)
        assert two["metrics"]["train/skipped"] == 0.0
    assert one["weights"].keys() == two["weights"].keys()
    for name, weight in one["weights"].items():
        # one AdamW step of lr 1e-3 moves every weight by up to ~1e-3: agreeing to 1e-4 is agreeing on the step
        torch.testing.assert_close(two["weights"][name], weight, rtol=0, atol=1e-4, msg=name)


def test_the_default_update_keeps_the_on_policy_ratio_exactly_one(
    results: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    # invariant 4 under torchrun: one epoch, one minibatch: each rank's pass is its rows' old policy
    assert results[1]["default"]["metrics"]["train/ratio_max_dev_first_mb"] == 0.0
