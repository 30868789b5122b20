"""One update of each case in :data:`CASES` (and one SFT step), run by every rank of a torchrun launch or by a
single process; writes what it measured to ``OUT/rank{N}.pt`` (rank 0: metrics and the gathered weights).

``python fsdp_worker.py OUT`` is the single-process reference; ``torchrun --nproc_per_node 2 fsdp_worker.py OUT``
the sharded run. tests/distributed/test_fsdp.py compares the two.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from harmonyrl.config import RLConfig
from harmonyrl.distributed.fsdp import full_state_dict, sharded_copy
from harmonyrl.distributed.world import join, leave
from harmonyrl.models.tiny_gpt_oss import build_config, build_model
from harmonyrl.rl.learner import Learner
from harmonyrl.sft.train import Demo, sft_step
from harmonyrl.types import Trajectory

VOCAB = 97
PREFIX = 40
"""Every episode starts with the same 40 tokens: the single process scores them once (shared prefix)."""

CASES: dict[str, dict[str, Any]] = {
    "default": {},
    "two_epochs_two_minibatches": {
        "epochs": 2,
        "minibatches": 2,
        "aggregation": "seq-mean-token-mean",
        "entropy_coef": 0.01,
        "kl": {"coef": 0.05, "use": "loss"},
    },
    "one_row_minibatches": {"minibatches": 5, "aggregation": "seq-mean-token-sum-norm"},
}
"""RL configs: the default; several optimizer steps (guard snapshot, reference model, KL and entropy terms);
minibatches of one row (the second rank has no row and runs zero-weighted passes)."""


def trajectories() -> list[Trajectory]:
    """5 trainable episodes of different lengths in 3 groups (an odd count: shards of 3 and 2 rows), a
    zero-variance group that is dropped and an environment failure that is masked."""
    head = tuple(torch.randint(1, VOCAB, (PREFIX,), generator=torch.Generator().manual_seed(99)).tolist())
    rows = [(0, 1.0, 30, 1), (0, 0.0, 22, 2), (0, 0.0, 41, 3), (1, 0.0, 25, 4), (1, 1.0, 37, 5), (2, 1.0, 20, 6),
            (2, 1.0, 28, 7)]  # fmt: skip
    out = []
    for group, reward, length, seed in rows:
        ids = head + tuple(torch.randint(1, VOCAB, (length,), generator=torch.Generator().manual_seed(seed)).tolist())
        mask = (0,) * (PREFIX + 8) + (1,) * (length - 8)
        out.append(Trajectory(f"t{group}", group, ids, mask, (-1.0,) * len(ids), reward, True, False, None, ()))
    return out


def model() -> torch.nn.Module:
    return build_model(build_config("nano", VOCAB, 0, 1), seed=0)


def run(out: Path) -> None:
    torch.use_deterministic_algorithms(True, warn_only=True)
    world = join()
    results: dict[str, Any] = {}
    for name, fields in CASES.items():
        cfg = RLConfig(**{"lr": 1e-3, **fields})
        learner = Learner.create(cfg, model(), pad_id=0, norm=64.0, seed=0, world=world)
        metrics = learner.update(trajectories()).metrics
        results[name] = {"metrics": metrics, "weights": full_state_dict(learner.model)}
    plain = model()
    trainee = sharded_copy(plain, world) if world.distributed else plain
    optimizer = torch.optim.AdamW(trainee.parameters(), lr=1e-3, weight_decay=0.0)
    demos = [Demo(t.token_ids, t.loss_mask) for t in trajectories()[:3]]  # 3 rows: shards of 2 and 1
    loss = sft_step(trainee, optimizer, demos, pad_id=0, world=world)
    results["sft"] = {"metrics": {"sft/loss": loss}, "weights": full_state_dict(trainee)}
    if world.is_main:
        torch.save(results, out / f"world{world.size}.pt")
    leave(world)


if __name__ == "__main__":
    run(Path(sys.argv[1]))
