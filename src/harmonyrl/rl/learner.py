"""The learner: everything an RL step updates, and the one call the training loop makes per step.

It owns the optimizer, the optional value head (critic estimators), the reference policy (KL and its
metric; :mod:`harmonyrl.rl.reference`: with LoRA the policy's own base, adapters switched) and the replay
buffer (the off-policy soft-Q row) through its :class:`UpdateRule`, chosen once from the typed loss choice:
on-policy PPO-family updates (:mod:`harmonyrl.rl.on_policy`), or soft Q-learning (:mod:`harmonyrl.rl.soft_q`).

Under torchrun (``world``) the learner trains a sharded copy of the run's model (FSDP2, see
:mod:`harmonyrl.distributed.fsdp`; the reference model is sharded too), and :meth:`Learner.sync` gathers its
weights back into rank 0's plain model for the engine and the checkpoints. Critic estimators and soft Q-learning
run in one process only (:func:`check_distributable`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

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
from harmonyrl.rl.distill_teacher import load_teacher
from harmonyrl.rl.on_policy import OnPolicy
from harmonyrl.rl.reference import Reference, reference_for
from harmonyrl.rl.soft_q import SoftQLearning
from harmonyrl.run.resume import Progress, load_optimizer
from harmonyrl.types import Trajectory


class UpdateRule(Protocol):
    """One kind of RL update, as the learner drives it: :class:`~harmonyrl.rl.on_policy.OnPolicy` (the PPO
    family) or :class:`~harmonyrl.rl.soft_q.SoftQLearning`. A rule owns what it trains besides the policy (a value
    head, a target network, a replay buffer) and says what a resume needs of it."""

    @property
    def value_head(self) -> ValueHead | None:
        """The rule's critic (GAE / A2C, soft Q-learning's V), or None."""
        ...

    def update(
        self,
        model: GptOssForCausalLM,
        optimizer: torch.optim.Optimizer,
        reference: Reference,
        trajectories: Sequence[Trajectory],
    ) -> UpdateResult: ...

    def param_groups(self, params: list[torch.nn.Parameter]) -> list[dict[str, Any]]:
        """The optimizer's groups over the policy's trainable ``params`` and the rule's own."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass
class Learner:
    cfg: RLConfig
    model: GptOssForCausalLM
    optimizer: torch.optim.Optimizer
    reference: Reference
    rule: UpdateRule
    world: World = SINGLE
    """The torchrun launch this learner trains in (:data:`SINGLE`: one process, nothing sharded)."""
    precision: Precision = "fp32"
    """The update's compute precision (bf16: autocast; what trains and the optimizer stay fp32)."""

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
        policy and the reference are sharded copies holding rank 0's weights. ``norm`` is the constant of the
        ``seq-mean-token-sum-norm`` aggregation (the episode's token budget)."""
        check_distributable(cfg, world)
        if world.distributed and has_lora(model):
            raise ValueError("model.lora runs in one process only (adapters are not sharded): launch without torchrun")
        reference = reference_for(model, world, rl_start)
        device = next(model.parameters()).device
        value_head = ValueHead(int(model.config.hidden_size)).to(device) if cfg.uses_critic else None
        trained = model if not world.distributed else sharded_copy(model, world)
        rule: UpdateRule
        if isinstance(cfg.loss, SoftQ):
            assert value_head is not None  # cfg.uses_critic holds for soft_q
            rule = SoftQLearning.create(cfg, cfg.loss, pad_id, value_head, seed)
        else:
            teacher = load_teacher(cfg.distill.teacher, model) if cfg.distill is not None else None
            rule = OnPolicy(cfg, pad_id, norm, value_head, teacher, world)
        placeholder = torch.optim.SGD([torch.zeros(1)])  # replaced below: optimizer_for reads the rule's groups
        learner = Learner(cfg, trained, placeholder, reference, rule, world, precision)
        learner.optimizer = learner.optimizer_for(trained)
        return learner

    def resume(self, model: GptOssForCausalLM, saved: Progress) -> None:
        """Continue from a saved RL step: ``model`` holds its weights (on rank 0), the checkpoint the optimizer
        and the rule's state."""
        self.model = model if not self.world.distributed else sharded_copy(model, self.world)
        self.optimizer = self.optimizer_for(self.model)
        load_optimizer(saved, model, self.model, self.optimizer, self.world)
        self.rule.load_state_dict(saved.state.parts.learner or {})

    def sync(self, model: GptOssForCausalLM) -> None:
        """Bring the run's plain ``model`` up to the trained weights (under torchrun: gathered onto rank 0; a
        collective every rank calls). In one process the learner trains ``model`` itself: nothing to do."""
        if self.model is not model:
            copy_into(model, self.model, self.world)

    def optimizer_for(self, model: torch.nn.Module) -> torch.optim.Optimizer:
        """AdamW over ``model``'s trainable parameters (with LoRA: the adapters only) and the rule's own (a
        value head; for soft Q-learning in a group of its own)."""
        params = [p for p in model.parameters() if p.requires_grad]
        return torch.optim.AdamW(self.rule.param_groups(params), lr=self.cfg.lr, weight_decay=0.0, betas=(0.9, 0.99))

    def update(self, trajectories: Sequence[Trajectory]) -> UpdateResult:
        """One RL step's update from this step's episodes. Its metrics log the skip reason too: ``train/skipped``
        is 1 when nothing was trainable (e.g. every group solved alike); ``guard/skipped`` when a stability guard
        rolled the update back."""
        with autocast(self.precision, next(self.model.parameters()).device):
            return self.rule.update(self.model, self.optimizer, self.reference, trajectories)


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
