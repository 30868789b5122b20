"""On-policy distillation: the reverse KL to a teacher on the student's own samples, two ways.

The student samples a token ``x_t`` from ``π`` (its sampler); the teacher ``π_T`` scores the same prefixes.

``kind=sampled`` (:func:`reverse_kl_advantage`): the teacher scores exactly the sampled id. The per-token
estimate of the reverse KL ``KL(π ‖ π_T)`` at that position is ``k_t = log π(x_t) - log π_T(x_t)`` (k1: unbiased
under the student's own sampling), and the student is pushed toward the teacher by the advantage
``-weight · k_t`` on that token (discount 0: each token is credited with its own term only, as in Thinking
Machines' on-policy distillation, 2025). Why an advantage and not a loss: the gradient of the reverse KL under
the student's own samples is the score-function form ``E_π[∇log π(x) · (log π(x) - log π_T(x))]``, a policy
gradient whose advantage is ``-k_t``; differentiating ``k_t`` itself on fixed samples gives ``E_π[∇log π(x)] = 0``
in expectation, i.e. no signal. It needs one teacher log-prob per sampled token (any vocabulary: 201k ids with
o200k_harmony), and it goes through everything the PPO family already does to a sampled token: the ratio and
its clip, rollout correction, the decoupled loss of the async pipeline, and the stability guards. Its cost: one
sampled id per position carries the whole signal (high variance: measured in docs/distill.md).

``kind=full`` (:func:`full_reverse_kl`): at every sampled position the exact reverse KL over the vocabulary,
``Σ_v π(v) (log π(v) - log π_T(v))``, differentiated through ``π`` — a loss term, not an advantage: it is a
deterministic function of the student's logits on fixed prefixes, so its gradient is exact (no score-function
estimate), and every vocabulary entry is pushed toward the teacher, not only the sampled one. The sampled
prefixes still make it on-policy (the student learns the teacher's answer in the states it reaches itself). It
needs both models' ``[b, T, V]`` logits of a micro-batch: cheap with a small vocabulary, ~0.8 GB per 1,000
positions with 201k ids.

Shapes: the sampled form's tensors are ``[B, T-1]`` (position ``t`` scores token ``t+1``); ``mask`` is 1 on the
sampled tokens the loss trains on, and off the mask the advantage is 0. The full form reads ``[..., V]`` logits
and returns ``[...]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DistillTerm:
    """The distillation term of one batch."""

    advantage: torch.Tensor
    """``[B, T-1]``: ``-weight · (student_logp - teacher_logp)`` (less the batch mean if centred) on the mask, 0
    elsewhere."""
    reverse_kl: torch.Tensor
    """``[B, T-1]``: the per-token reverse-KL estimate ``student_logp - teacher_logp`` on the mask, 0 elsewhere."""


def reverse_kl_advantage(
    student_logp: torch.Tensor, teacher_logp: torch.Tensor, mask: torch.Tensor, weight: float, center: bool = False
) -> DistillTerm:
    """The per-token distillation advantage of sampled tokens.

    ``student_logp``: ``[B, T-1]`` log-probs of the sampled ids under the policy that sampled them;
    ``teacher_logp``: ``[B, T-1]`` the teacher's log-probs of the same ids; ``mask``: ``[B, T-1]`` (0/1);
    ``weight`` ≥ 0 scales the advantage. ``center`` subtracts the batch's mean ``k̄`` over the masked tokens
    first: ``-weight · (k_t - k̄)``. A baseline that does not depend on the token leaves the expected gradient as
    it is (``E_π[∇log π] = 0``); without it every advantage is negative on average (``E[k] = KL ≥ 0``), so each
    update pushes every sampled token down and the student's entropy climbs (measured: docs/distill.md).
    Computed in the inputs' dtype; no gradient flows (both are targets).
    """
    if student_logp.shape != teacher_logp.shape or student_logp.shape != mask.shape:
        raise ValueError(
            f"student {tuple(student_logp.shape)}, teacher {tuple(teacher_logp.shape)} and mask "
            f"{tuple(mask.shape)} log-probs must have one shape"
        )
    m = mask.to(student_logp.dtype)
    kl = (student_logp.detach() - teacher_logp.detach()) * m
    baseline = kl.sum() / m.sum().clamp(min=1) if center else torch.zeros((), dtype=kl.dtype)
    return DistillTerm(advantage=-weight * (kl - baseline) * m, reverse_kl=kl)


def distill_metrics(term: DistillTerm, student_logp: torch.Tensor, teacher_logp: torch.Tensor,
                    mask: torch.Tensor) -> dict[str, float]:  # fmt: skip
    """``distill/*`` of one batch: the mean per-token reverse KL (k1) and its sequence mean, the mean student
    and teacher log-prob of the sampled tokens, and the share of tokens the teacher finds likelier than the
    student does. All 0 when nothing is masked."""
    m = mask.bool()
    n = int(m.sum())
    if n == 0:
        keys = ("reverse_kl", "reverse_kl_seq", "student_logp", "teacher_logp", "teacher_prefers")
        return {f"distill/{k}": 0.0 for k in keys}
    rows = m.any(dim=-1)
    per_seq = term.reverse_kl.double().sum(-1)[rows] / m.sum(-1)[rows]
    return {
        "distill/reverse_kl": float(term.reverse_kl.double()[m].mean()),
        "distill/reverse_kl_seq": float(per_seq.mean()),
        "distill/student_logp": float(student_logp.double()[m].mean()),
        "distill/teacher_logp": float(teacher_logp.double()[m].mean()),
        "distill/teacher_prefers": float((teacher_logp[m] > student_logp[m]).double().mean()),
    }


def full_reverse_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """``[...]`` the exact reverse KL ``KL(π ‖ π_T) = Σ_v π(v) (log π(v) - log π_T(v))`` at each position, from
    ``[..., V]`` logits of the student (``π``, differentiated) and the teacher (``π_T``, a constant). Computed in
    float32 at least; ≥ 0, and 0 where the two distributions are equal."""
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(
            f"student {tuple(student_logits.shape)} and teacher {tuple(teacher_logits.shape)} logits must have one "
            "shape"
        )
    dtype = torch.promote_types(student_logits.dtype, torch.float32)
    log_p = torch.log_softmax(student_logits.to(dtype), dim=-1)
    log_q = torch.log_softmax(teacher_logits.detach().to(dtype), dim=-1)
    return (log_p.exp() * (log_p - log_q)).sum(-1)
