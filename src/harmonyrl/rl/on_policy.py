"""The on-policy rule (the PPO family: GRPO, PPO, RLOO, REINFORCE++, GSPO, A2C, Dr.GRPO): one RL step's episodes
become a batch with its targets (:func:`~harmonyrl.rl.targets.prepare`), on-policy distillation adds its teacher's
term (:func:`~harmonyrl.rl.distill_teacher.add_teacher`), and :func:`~harmonyrl.rl.update.rl_update` makes the
update's optimizer steps. The learner drives it through the same :class:`~harmonyrl.rl.learner.UpdateRule`
protocol as soft Q-learning (:class:`~harmonyrl.rl.soft_q.SoftQLearning`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from transformers import GptOssForCausalLM

from harmonyrl.config import RLConfig
from harmonyrl.distributed.world import SINGLE, World
from harmonyrl.learn.update_result import UpdateResult
from harmonyrl.models.value_head import ValueHead
from harmonyrl.rl.distill_teacher import Teacher, add_teacher
from harmonyrl.rl.reference import Reference
from harmonyrl.rl.targets import prepare
from harmonyrl.rl.update import rl_update
from harmonyrl.types import Trajectory


@dataclass
class OnPolicy:
    """The PPO family's update rule: what it reads besides the model, the optimizer and the reference."""

    cfg: RLConfig
    pad_id: int
    norm: float
    """Constant of the ``seq-mean-token-sum-norm`` aggregation: the episode's token budget."""
    value_head: ValueHead | None = None
    """The critic of GAE / A2C (trained in the policy's optimizer group); None for the critic-free estimators."""
    teacher: Teacher | None = None
    """The on-policy distillation teacher (``rl.distill``), scoring each step's batch before the update."""
    world: World = SINGLE

    def update(
        self,
        model: GptOssForCausalLM,
        optimizer: torch.optim.Optimizer,
        reference: Reference,
        trajectories: Sequence[Trajectory],
    ) -> UpdateResult:
        """Nothing trainable (every group alike, or all faulted): a skipped step that still counts the masked
        faults, so the step's figures do not depend on whether it trained."""
        device = next(model.parameters()).device
        prepared = prepare(trajectories, self.cfg, self.pad_id, device)
        if prepared is None:
            masked = sum(t.failure is not None for t in trajectories)
            return UpdateResult({"train/skipped": 1.0, "train/masked_failures": float(masked)}, "nothing_trainable")
        prepared, distilled = add_teacher(prepared, self.teacher, self.cfg)
        teacher = self.teacher.model if self.teacher is not None else None
        result = rl_update(model, optimizer, prepared, self.cfg, reference, self.value_head, self.norm, self.world,
                           teacher)  # fmt: skip
        return replace(result, metrics=result.metrics | distilled | {"train/skipped": 0.0})

    def param_groups(self, params: list[torch.nn.Parameter]) -> list[dict[str, Any]]:
        """One group: the policy's trainable parameters and the critic's, at ``rl.lr``."""
        head = list(self.value_head.parameters()) if self.value_head is not None else []
        return [{"params": [*params, *head]}]

    def state_dict(self) -> dict[str, Any]:
        """What a resume needs besides the model and the optimizer: the critic, when there is one."""
        return {"value_head": self.value_head.state_dict()} if self.value_head is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.value_head is not None:
            self.value_head.load_state_dict(state["value_head"])
