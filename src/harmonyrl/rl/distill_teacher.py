"""The distillation teacher (``rl.distill.teacher``): a frozen checkpoint that scores the student's sampled ids.

Loaded once when the learner is made (so a resume or a ``harmonyrl replay`` loads it again from the same
folder: the teacher is a pure function of its checkpoint, and its log-probs are recomputed, not stored). Each RL
step, :func:`add_teacher` runs one no-grad pass of the teacher over the step's whole batch (in ``rl.micro_batch``
rows, the head only at the sampled positions) and attaches its ``[B, T-1]`` log-probs of exactly the ids the
student sampled to the batch; :func:`harmonyrl.rl.targets.loss_targets` turns them into the
per-token advantage of :mod:`harmonyrl.algorithms.distill`.

A teacher whose vocabulary differs from the student's is refused in one line (its ids would mean other tokens):
by the config check before any work (``config.json``'s ``vocab_size`` against ``model.tokenizer``), and here
against the student model itself. The teacher runs the student's attention kernel (a sink-less student kernel
excepted: the teacher keeps the exact one), in the dtype of the student's frozen weights.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch
from transformers import GptOssForCausalLM

from harmonyrl.algorithms.distill import distill_metrics, reverse_kl_advantage
from harmonyrl.config import RLConfig
from harmonyrl.errors import CheckpointError
from harmonyrl.models.attention import kernel_of, set_kernel
from harmonyrl.models.load import load_checkpoint
from harmonyrl.rl.targets import Prepared, no_grad_pass

EXACT_KERNEL = "harmonyrl_eager"
"""The teacher's kernel when the student runs the deliberately sink-less one (a teacher is scored exactly)."""


@dataclass(frozen=True)
class Teacher:
    """A frozen teacher model and where it came from."""

    model: GptOssForCausalLM
    path: Path

    def logprobs(self, prepared: Prepared, micro_batch: int) -> torch.Tensor:
        """``[B, T-1]`` the teacher's log-probs of the batch's target ids (one no-grad pass over the batch)."""
        return no_grad_pass(self.model, prepared.batch, micro_batch=micro_batch)[0]


def load_teacher(path: Path, student: GptOssForCausalLM) -> Teacher:
    """The checkpoint at ``path`` as a frozen teacher beside ``student`` (same device, the dtype of the student's
    first weight). :class:`CheckpointError` (one line) when its vocabulary is not the student's."""
    first = next(student.parameters())
    model = load_checkpoint(path, dtype=first.dtype, device=first.device)
    vocab, own = int(model.config.vocab_size), int(student.config.vocab_size)
    if vocab != own:
        raise CheckpointError(
            f"rl.distill.teacher '{path}' has vocab {vocab}, the student {own}: a teacher must share the student's "
            "tokenizer"
        )
    kernel = kernel_of(student)
    set_kernel(model, EXACT_KERNEL if kernel == "harmonyrl_sinkless" else kernel)
    model.eval()
    model.requires_grad_(False)
    return Teacher(model, path)


def add_teacher(prepared: Prepared, teacher: Teacher | None, cfg: RLConfig) -> tuple[Prepared, dict[str, float]]:
    """``prepared`` with the teacher's log-probs on its batch, and the step's ``distill/*`` metrics (measured on
    every sampled token, against the log-probs of the policy that sampled it); unchanged and no metrics without a
    teacher."""
    if teacher is None or cfg.distill is None:
        return prepared, {}
    batch = prepared.batch
    teacher_logp = teacher.logprobs(prepared, cfg.micro_batch)
    term = reverse_kl_advantage(batch.sampler_logprobs, teacher_logp, batch.loss_mask, cfg.distill.weight)
    metrics = distill_metrics(term, batch.sampler_logprobs, teacher_logp, batch.loss_mask)
    return replace(prepared, batch=replace(batch, teacher_logprobs=teacher_logp)), metrics
