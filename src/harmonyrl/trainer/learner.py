"""The learner: everything an RL step updates, and the one call the training loop makes per step.

It owns the optimizer, the optional value head (critic estimators), the reference model (KL and its
metric) and the replay buffer (the off-policy soft-Q row), and dispatches on the typed loss choice:
on-policy PPO-family updates in :mod:`harmonyrl.trainer.rl`, soft Q-learning in :mod:`harmonyrl.trainer.soft_q`.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from harmonyrl.algorithms.choices import SoftQ
from harmonyrl.config import RLConfig
from harmonyrl.trainer.critic import ValueHead
from harmonyrl.trainer.replay import ReplayBuffer
from harmonyrl.trainer.rl import prepare, rl_update
from harmonyrl.trainer.soft_q import SoftQState, soft_q_update
from harmonyrl.types import Trajectory


@dataclass
class Learner:
    cfg: RLConfig
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    ref_model: torch.nn.Module
    pad_id: int
    norm: float
    """Constant of the ``seq-mean-token-sum-norm`` aggregation: the episode's token budget."""
    value_head: ValueHead | None = None
    soft_q: SoftQState | None = None

    @staticmethod
    def create(cfg: RLConfig, model: torch.nn.Module, pad_id: int, norm: float, seed: int) -> Learner:
        """A learner for ``model`` at the start of RL; the reference model is a frozen copy of it."""
        ref_model = copy.deepcopy(model).eval().requires_grad_(False)
        value_head = ValueHead(int(model.config.hidden_size)) if cfg.uses_critic else None
        params = list(model.parameters()) + (list(value_head.parameters()) if value_head is not None else [])
        optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0, betas=(0.9, 0.99))
        soft_q = None
        if isinstance(cfg.loss, SoftQ):
            soft_q = SoftQState.create(cfg.loss, ReplayBuffer(cfg.loss.replay_capacity, seed))
        return Learner(cfg, model, optimizer, ref_model, pad_id, norm, value_head, soft_q)

    def update(self, trajectories: Sequence[Trajectory]) -> dict[str, float]:
        """One RL step's update from this step's episodes. ``train/skipped`` is 1 when nothing was trainable
        (e.g. every group solved alike); ``guard/skipped`` when a stability guard rolled the update back."""
        if self.soft_q is not None:
            assert self.value_head is not None
            return soft_q_update(
                self.model, self.optimizer, self.value_head, self.soft_q, trajectories, self.cfg, self.pad_id
            )
        prepared = prepare(trajectories, self.cfg, self.pad_id)
        if prepared is None:
            return {"train/skipped": 1.0}
        metrics = rl_update(
            self.model, self.optimizer, prepared, self.cfg, self.ref_model, self.value_head, norm=self.norm
        )
        return metrics | {"train/skipped": 0.0}
