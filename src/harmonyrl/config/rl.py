"""The ``rl`` section: the update (a typed algorithm choice), how tasks are drawn, and the async pipeline."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from harmonyrl.algorithms.choices import A2C, GAE, GRPO, Advantage, Guards, KLControl, PolicyLoss, PPOClip, SoftQ
from harmonyrl.algorithms.correction import RolloutCorrectionConfig
from harmonyrl.algorithms.losses import AggregationMode
from harmonyrl.frozen import Frozen, checkpoint_folder
from harmonyrl.rollout.curriculum import CurriculumConfig
from harmonyrl.rollout.sampling import SamplingConfig


class AsyncConfig(Frozen):
    """The rollout pipeline (docs/async.md): rollouts of later steps are collected while a step trains."""

    max_staleness: int = Field(0, ge=0)
    """Versions a trained sample may lag (k): step s trains on rollouts of version max(0, s-k); 0: synchronous."""
    lr_decay: float = Field(0.0, ge=0)
    """Staleness-aware step: with k > 0 each update's lr is rl.lr / (1 + lr_decay * k) (0: off; docs/async.md)."""

    partial: bool = False
    """Partial rollouts: an episode in flight while the trainer publishes a newer version continues under it, each
    token recording the version that sampled it; staleness is bounded per token (docs/async.md). Needs k >= 1."""

    @property
    def enabled(self) -> bool:
        """Rollouts run ahead of the trainer."""
        return self.max_staleness > 0

    @model_validator(mode="after")
    def _partial_needs_updates_in_flight(self) -> AsyncConfig:
        if self.partial and self.max_staleness == 0:
            raise ValueError(
                "rl.async.partial=true continues episodes across weight updates, and with "
                "rl.async.max_staleness=0 no update happens while an episode runs: set max_staleness >= 1"
            )
        return self


class DistillConfig(Frozen):
    """On-policy distillation (docs/distill.md): a teacher scores the student's own samples, and the per-token
    reverse KL trains the student toward it — on the sampled ids as an advantage term (``kind=sampled``), or over
    the whole vocabulary at every sampled position as a loss term (``kind=full``);
    :mod:`harmonyrl.algorithms.distill` says when each and why."""

    teacher: Path
    """The teacher's checkpoint folder (same tokenizer and vocabulary as the student; any size)."""
    kind: Literal["sampled", "full"] = "sampled"
    """``sampled``: ``-(log π - log π_T)`` of each sampled id as a per-token advantage (one teacher log-prob per
    token: any vocabulary). ``full``: the exact reverse KL ``Σ_v π(v) (log π(v) - log π_T(v))`` at each sampled
    position as a loss term (the micro-batch's ``[b, T, V]`` logits of both models: a small vocabulary)."""
    weight: float = Field(1.0, gt=0, allow_inf_nan=False)
    """Scale of the teacher's term: the per-token advantage (``sampled``) or the loss term (``full``)."""
    env_reward: bool = True
    """Keep the env's reward advantage beside the teacher's term (False: distillation alone)."""
    center: bool = True
    """``sampled`` only: subtract the batch's mean per-token reverse KL from the term (a baseline: same expected
    gradient, without the push-down of every sampled token that raises the student's entropy; docs/distill.md)."""

    @field_validator("teacher")
    @classmethod
    def _is_checkpoint(cls, path: Path) -> Path:
        checkpoint_folder(path)
        return path


class RLConfig(Frozen):
    """The RL update. The algorithm is a typed choice (see :mod:`harmonyrl.algorithms.choices`):
    ``advantage`` × ``loss`` × ``aggregation``, plus KL, entropy, rollout correction and stability guards."""

    steps: int = Field(60, ge=0)
    """RL steps (rollout, then update) after the warm start (why 60: docs/tuning.md)."""
    lr: float = Field(1e-4, gt=0)
    """Learning rate of the RL optimizer (AdamW; why 1e-4: docs/tuning.md)."""
    advantage: Advantage = GRPO()
    loss: PolicyLoss = PPOClip()
    aggregation: AggregationMode = "token-mean"
    """How per-token losses are reduced (Dr.GRPO pairs with ``seq-mean-token-sum-norm``)."""
    kl: KLControl = KLControl()
    entropy_coef: float = Field(0.0, ge=0)
    correction: RolloutCorrectionConfig = RolloutCorrectionConfig()
    """Importance weights / rejection against the sampler-trainer gap (``mismatch/*``); off by default."""
    guards: Guards = Guards()
    epochs: int = Field(1, ge=1)
    minibatches: int = Field(1, ge=1)
    micro_batch: int = Field(32, ge=1)
    """Episodes (rows) in one forward/backward pass of the update; gradients accumulate over the passes of an
    optimizer step, so it bounds the activation peak (``harmonyrl plan``), not what is learnt. At gpt-oss-20b's
    4k tokens use 1 (32 rows of 4k tokens are ~59 GiB of activations)."""
    max_grad_norm: float = Field(1.0, gt=0)
    lr_warmup_steps: int = Field(0, ge=0)
    """The learning rate rises linearly over the first N optimizer steps (``lr · n / N`` at the n-th), then stays
    at ``rl.lr``; 0: no warm-up. Why: Adam's first steps move every parameter by ~lr whatever its gradient
    (docs/distill.md measures one tripling a loss it descends). Counted from the optimizer's own step count, so a
    resume continues the ramp where it stopped."""
    skip_zero_variance_groups: bool = True
    """Drop groups whose rewards are all equal when the advantage is group-relative (GRPO, RLOO,
    REINFORCE++ with a group baseline): their advantage is 0 and they only cost compute."""
    routing_replay: Literal["none", "r2", "r3"] = "none"
    """MoE routing the trainer's forward uses: its own top-k (none); the experts of the step's first trainer
    pass, reused by every later pass (r2); the experts the engine chose when sampling (r3). Combine weights
    always come from the current router logits, so the router keeps learning (see models/moe_routing.py)."""
    sampling: SamplingConfig = SamplingConfig()
    """Dynamic sampling: refill the batch past groups whose rewards are all equal (docs/curriculum.md)."""
    curriculum: CurriculumConfig | None = None
    """Draw training tasks towards a target pass rate, easy to hard (null: in order; docs/curriculum.md). Setting
    any key turns it on, e.g. ``rl.curriculum.target=0.5``."""
    async_: AsyncConfig = Field(AsyncConfig(), alias="async")
    """Rollouts ahead of the trainer with bounded staleness (``rl.async.max_staleness``, docs/async.md)."""
    distill: DistillConfig | None = None
    """On-policy distillation from a teacher checkpoint (null: off); e.g. ``rl.distill.teacher=CKPT``."""

    # ``async`` is a Python keyword: the field is ``async_``, read and written as ``async``
    model_config = ConfigDict(**Frozen.model_config, validate_by_name=True, validate_by_alias=True,
                              serialize_by_alias=True)  # fmt: skip

    @model_validator(mode="after")
    def _partial_needs_the_decoupled_loss(self) -> RLConfig:
        """A partial rollout's episode is sampled by several policies, one per token: only the decoupled loss
        (a PPO-clip loss with ``rl.correction.weights``, bypass off) corrects each token by its own behaviour
        log-prob and keeps the trust region on the trainer's policy; a plain or bypass PPO would centre it on a
        patchwork of old policies, and soft Q-learning has no behaviour correction."""
        if not self.async_.partial:
            return self
        if self.correction.weights is None or self.correction.bypass or not isinstance(self.loss, PPOClip):
            raise ValueError(
                "rl.async.partial=true samples one episode with several policy versions, which only the decoupled "
                "loss corrects token by token: use rl.loss.kind=ppo_clip with rl.correction.weights (e.g. "
                "rl.correction.weights.mode=truncate) and rl.correction.bypass=false"
            )
        if self.sampling.filter_uniform_groups:  # its batches run one after another on one engine copy
            raise ValueError(
                "rl.async.partial=true needs the batches on engine copies, which rl.sampling.filter_uniform_groups "
                "turns off (its extra draws would interleave): use one or the other"
            )
        return self

    @property
    def uses_critic(self) -> bool:
        """A value head is trained: critic advantages (GAE, A2C) or the soft-Q learner's V(s)."""
        return isinstance(self.advantage, GAE | A2C) or isinstance(self.loss, SoftQ)
