"""The learner: everything an RL step updates, and the one call the training loop makes per step.

It owns the optimizer, the optional value head (critic estimators), the reference policy (KL and its
metric; :mod:`harmonyrl.rl.reference`: with LoRA the policy's own base, adapters switched) and the replay
buffer (the off-policy soft-Q row), and dispatches on the typed loss choice:
on-policy PPO-family updates in :mod:`harmonyrl.rl.update`, soft Q-learning in :mod:`harmonyrl.rl.soft_q`.

Under torchrun (``world``) the learner trains a sharded copy of the run's model (FSDP2, see
:mod:`harmonyrl.distributed.fsdp`; the reference model is sharded too), and :meth:`Learner.sync` gathers its
weights back into rank 0's plain model for the engine and the checkpoints. Critic estimators and soft Q-learning
run in one process only (:func:`check_distributable`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from transformers import GptOssForCausalLM

from harmonyrl.algorithms.choices import SoftQ
from harmonyrl.config import RLConfig
from harmonyrl.distributed.fsdp import copy_into, sharded_copy
from harmonyrl.distributed.world import SINGLE, World
from harmonyrl.learn.device import Precision, autocast
from harmonyrl.learn.update_result import UpdateResult
from harmonyrl.models.lora import has_lora
from harmonyrl.models.value_head import ValueHead
from harmonyrl.rl.distill_teacher import Teacher, add_teacher, load_teacher
from harmonyrl.rl.reference import Reference, reference_for
from harmonyrl.rl.replay_buffer import ReplayBuffer
from harmonyrl.rl.soft_q import SoftQState, soft_q_update
from harmonyrl.rl.targets import prepare
from harmonyrl.rl.update import rl_update
from harmonyrl.run.resume import Progress, load_optimizer
from harmonyrl.types import Trajectory


@dataclass
class Learner:
    cfg: RLConfig
    model: GptOssForCausalLM
    optimizer: torch.optim.Optimizer
    reference: Reference
    pad_id: int
    norm: float
    """Constant of the ``seq-mean-token-sum-norm`` aggregation: the episode's token budget."""
    value_head: ValueHead | None = None
    soft_q: SoftQState | None = None
    world: World = SINGLE
    """The torchrun launch this learner trains in (:data:`SINGLE`: one process, nothing sharded)."""
    precision: Precision = "fp32"
    """The update's compute precision (bf16: autocast; what trains and the optimizer stay fp32)."""
    teacher: Teacher | None = None
    """The on-policy distillation teacher (``rl.distill``), scoring each step's batch before the update."""

    @staticmethod
    def create(
        cfg: RLConfig,
        model: GptOssForCausalLM,
        pad_id: int,
        norm: float,
        seed: int,
        world: World = SINGLE,
        precision: Precision = "fp32",
        rl_start: dict[str, torch.Tensor] | None = None,
    ) -> Learner:
        """A learner for ``model`` at the start of RL. The reference policy (:func:`reference_for`) is a frozen
        copy of it, or with LoRA ``model`` itself with its adapters switched: ``rl_start`` is then the adapters
        RL began with when ``model`` no longer holds them (a resume), None when it does. Under torchrun the
        policy and the reference are sharded copies holding rank 0's weights."""
        check_distributable(cfg, world)
        if world.distributed and has_lora(model):
            raise ValueError("model.lora runs in one process only (adapters are not sharded): launch without torchrun")
        reference = reference_for(model, world, rl_start)
        device = next(model.parameters()).device
        value_head = ValueHead(int(model.config.hidden_size)).to(device) if cfg.uses_critic else None
        soft_q = None
        if isinstance(cfg.loss, SoftQ):
            assert value_head is not None  # cfg.uses_critic holds for soft_q
            soft_q = SoftQState.create(cfg.loss, ReplayBuffer(cfg.loss.replay_capacity, seed), value_head)
        trained = model if not world.distributed else sharded_copy(model, world)
        placeholder = torch.optim.SGD([torch.zeros(1)])  # replaced below: optimizer_for reads the value head
        teacher = load_teacher(cfg.distill.teacher, model) if cfg.distill is not None else None
        learner = Learner(cfg, trained, placeholder, reference, pad_id, norm, value_head, soft_q, world, precision,
                          teacher)  # fmt: skip
        learner.optimizer = learner.optimizer_for(trained)
        return learner

    def resume(self, model: GptOssForCausalLM, saved: Progress) -> None:
        """Continue from a saved RL step: ``model`` holds its weights (on rank 0), the checkpoint the optimizer
        and the learner's extra state."""
        self.model = model if not self.world.distributed else sharded_copy(model, self.world)
        self.optimizer = self.optimizer_for(self.model)
        load_optimizer(saved, model, self.model, self.optimizer, self.world)
        self.load_extra_state(saved.state.parts.learner or {})

    def sync(self, model: GptOssForCausalLM) -> None:
        """Bring the run's plain ``model`` up to the trained weights (under torchrun: gathered onto rank 0; a
        collective every rank calls). In one process the learner trains ``model`` itself: nothing to do."""
        if self.model is not model:
            copy_into(model, self.model, self.world)

    def optimizer_for(self, model: torch.nn.Module) -> torch.optim.Optimizer:
        """AdamW over ``model``'s trainable parameters (with LoRA: the adapters only) and the value head's (for
        soft Q-learning in a group of its own, at ``rl.loss.critic_lr``)."""
        head = list(self.value_head.parameters()) if self.value_head is not None else []
        params = [p for p in model.parameters() if p.requires_grad]
        if isinstance(self.cfg.loss, SoftQ):  # the soft-Q critic learns at its own rate (docs/sac.md)
            groups: list[dict[str, Any]] = [{"params": params}, {"params": head, "lr": self.cfg.loss.critic_lr}]
            return torch.optim.AdamW(groups, lr=self.cfg.lr, weight_decay=0.0, betas=(0.9, 0.99))
        return torch.optim.AdamW([*params, *head], lr=self.cfg.lr, weight_decay=0.0, betas=(0.9, 0.99))

    def extra_state(self) -> dict[str, Any]:
        """What a resume needs besides the model and the optimizer: value head, soft-Q target network and replay."""
        state: dict[str, Any] = {}
        if self.value_head is not None:
            state["value_head"] = self.value_head.state_dict()
        if self.soft_q is not None:
            state["soft_q"] = self.soft_q.state_dict()
        return state

    def load_extra_state(self, state: dict[str, Any]) -> None:
        if self.value_head is not None:
            self.value_head.load_state_dict(state["value_head"])
        if self.soft_q is not None:
            self.soft_q.load_state_dict(state["soft_q"])

    def update(self, trajectories: Sequence[Trajectory]) -> UpdateResult:
        """One RL step's update from this step's episodes. Its metrics log the skip reason too: ``train/skipped``
        is 1 when nothing was trainable (e.g. every group solved alike); ``guard/skipped`` when a stability guard
        rolled the update back."""
        with autocast(self.precision, next(self.model.parameters()).device):
            return self._update(trajectories)

    def _update(self, trajectories: Sequence[Trajectory]) -> UpdateResult:
        device = next(self.model.parameters()).device
        if self.soft_q is not None:
            assert self.value_head is not None
            return soft_q_update(
                self.model,
                self.optimizer,
                self.value_head,
                self.reference,
                self.soft_q,
                trajectories,
                self.cfg,
                self.pad_id,
            )
        prepared = prepare(trajectories, self.cfg, self.pad_id, device)
        if prepared is None:  # still report the masked faults: the step's count must not depend on the update
            masked = sum(t.failure is not None for t in trajectories)
            return UpdateResult({"train/skipped": 1.0, "train/masked_failures": float(masked)}, "nothing_trainable")
        prepared, distilled = add_teacher(prepared, self.teacher, self.cfg)
        result = rl_update(
            self.model, self.optimizer, prepared, self.cfg, self.reference, self.value_head, self.norm, self.world
        )
        return replace(result, metrics=result.metrics | distilled | {"train/skipped": 0.0})


def check_distributable(cfg: RLConfig, world: World) -> None:
    """Refuse, in one line, what does not run sharded: soft Q-learning (its replay buffer and temperature are one
    process's) and critic estimators (the value head is not sharded)."""
    if not world.distributed:
        return
    if isinstance(cfg.loss, SoftQ):
        raise ValueError("rl.loss.kind=soft_q runs in one process only: launch it without torchrun")
    if cfg.uses_critic:
        raise ValueError(f"rl.advantage.kind={cfg.advantage.kind} (a critic) runs in one process only: launch it "
                         "without torchrun, or pick grpo, rloo or reinforce_pp")  # fmt: skip
