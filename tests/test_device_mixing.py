"""Nothing is created on one device and used on another: the GPU path checked without a GPU.

``tests/fake_cuda_checks.py`` runs, on the fake ``cuda`` device of ``tests/fake_cuda.py`` (real values on the CPU,
every op's devices checked as CUDA checks them), an SFT step, an RL update with every advantage estimator and
policy loss, R2 and R3 routing replay, the embedded engine's torch decode, the held-out evaluation, checkpoints
and a resume. The fake device must be installed before torch is imported, so the checks run in a child process,
once; each check is one test here. On the code before these checks existed, they failed on the advantages'
group sums (``torch.zeros(n_groups)`` on the CPU beside a CUDA batch) and on the routing records kept on the CPU.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harmonyrl.distributed.world import backend_for
from harmonyrl.run.state import Rngs

CHECKS = Path(__file__).with_name("fake_cuda_checks.py")
NAMES = [
    "advantages_every_estimator",
    *(
        f"rl_update_{a}_{loss}"
        for a in ("grpo", "grpo_False", "rloo", "reinforce_pp", "reinforce_pp_False", "gae", "a2c")
        for loss in ("ppo_clip", "gspo", "pg")
    ),
    "rl_update_kl_as_reward_entropy_correction",
    "rl_update_soft_q",
    "rl_update_r2",
    "rl_update_r3",
    "cuda_rng_state_round_trip",
    "train_sft_eval_rl_checkpoint_resume",
]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str | None]:
    out = tmp_path_factory.mktemp("fake_cuda") / "results.json"
    proc = subprocess.run([sys.executable, str(CHECKS), str(out)], capture_output=True, text=True, timeout=600)
    if not out.is_file():
        pytest.fail(
            f"the fake-cuda checks did not finish (rc {proc.returncode}):\n{proc.stdout}\n{proc.stderr[-4000:]}"
        )
    found: dict[str, str | None] = json.loads(out.read_text())
    assert sorted(found) == sorted(NAMES), "a check was added or renamed: list it in NAMES"
    return found


@pytest.mark.parametrize("name", NAMES)
def test_no_op_mixes_devices(results: dict[str, str | None], name: str) -> None:
    assert results[name] is None, results[name]


def test_a_checkpoint_without_a_cuda_rng_state_still_restores() -> None:
    """Checkpoints written without CUDA (and all older ones) have no ``rng_cuda``: they restore as before."""
    state = {"rng_torch": torch.get_rng_state(), "rng_python": random.getstate()}
    first = torch.rand(3)
    Rngs.from_plain(state).restore()
    assert torch.equal(torch.rand(3), first)


def test_collectives_have_a_backend_per_device() -> None:
    assert backend_for(cuda=False) == "gloo"
    assert backend_for(cuda=True) == "cpu:gloo,cuda:nccl"  # CPU figures all-reduce over gloo beside NCCL
