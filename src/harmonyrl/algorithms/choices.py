"""Typed choices of the RL algorithm: advantage estimator, policy loss, KL use, stability guards.

Each choice is a frozen pydantic model with a ``kind`` literal; :class:`harmonyrl.config.RLConfig` holds
discriminated unions of them, so ``rl.advantage.kind=rloo`` on the command line selects RLOO, and a typo in
``kind`` or a field that the chosen kind does not have is a config error, not a silent default. The trainer
dispatches with ``match`` on these types: there is no string-keyed registry to get out of sync.

Named algorithms are combinations of these choices (:class:`NamedAlgorithm`), shipped as algorithm presets beside
the run presets (``harmonyrl/presets/algorithms/NAME.yaml``, read by ``harmonyrl compare --algos``): PPO = GAE
advantages + critic + PPO clip; GRPO = group-normalised advantages + PPO clip; GSPO = GRPO advantages +
sequence-ratio loss; the SAC-style row is its own learner (soft Q-learning over token actions with a replay buffer).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from harmonyrl.algorithms.kl import KLEstimator
from harmonyrl.algorithms.losses import AggregationMode
from harmonyrl.frozen import Frozen

# ---- advantage estimators ------------------------------------------------------------------------------


class GRPO(Frozen):
    """Group-relative: ``(r - mean_group) / std_group``; ``std_normalize=False`` is Dr.GRPO's estimator."""

    kind: Literal["grpo"] = "grpo"
    std_normalize: bool = True


class RLOO(Frozen):
    """Leave-one-out baseline: ``r_i - mean_{j≠i} r_j`` within the group."""

    kind: Literal["rloo"] = "rloo"


class ReinforcePP(Frozen):
    """REINFORCE++: token returns whitened over the batch; ``group_baseline`` subtracts the group mean first."""

    kind: Literal["reinforce_pp"] = "reinforce_pp"
    group_baseline: bool = True
    gamma: float = Field(1.0, ge=0, le=1)


class GAE(Frozen):
    """GAE with a learned value head (PPO with a critic); value loss clipped at ``value_clip``."""

    kind: Literal["gae"] = "gae"
    gamma: float = Field(1.0, ge=0, le=1)
    lam: float = Field(0.95, ge=0, le=1)
    value_coef: float = Field(0.5, gt=0)
    value_clip: float | None = Field(0.2, gt=0)


class A2C(Frozen):
    """One-step advantage with a value baseline: ``r_t + γ V_{t+1} - V_t`` (GAE with λ = 0)."""

    kind: Literal["a2c"] = "a2c"
    gamma: float = Field(1.0, ge=0, le=1)
    value_coef: float = Field(0.5, gt=0)


Advantage = Annotated[GRPO | RLOO | ReinforcePP | GAE | A2C, Field(discriminator="kind")]

# ---- policy losses -------------------------------------------------------------------------------------


class PPOClip(Frozen):
    """PPO clipped surrogate; ``clip_high > clip_low`` is clip-higher; ``dual_clip`` bounds negative advantages."""

    kind: Literal["ppo_clip"] = "ppo_clip"
    clip_low: float = Field(0.2, ge=0)
    clip_high: float = Field(0.28, ge=0)
    dual_clip: float | None = Field(None, gt=1)


class GSPOLoss(Frozen):
    """GSPO: length-normalised sequence ratio, clipped at the paper's scale (3e-4 / 4e-4)."""

    kind: Literal["gspo"] = "gspo"
    clip_low: float = Field(3e-4, ge=0)
    clip_high: float = Field(4e-4, ge=0)


class PolicyGradient(Frozen):
    """Plain REINFORCE loss ``-A · logp`` (no ratio, no clipping)."""

    kind: Literal["pg"] = "pg"


class SoftQ(Frozen):
    """The off-policy SAC-style row: soft Q-values ``Q = α·(log π − log π_ref) + V`` (the LM head is the actor, a
    value head the critic, a Polyak copy of it the target network), fitted to n-step soft Bellman targets over
    episodes replayed from a buffer; the entropy it pays for is relative to the warm start (docs/sac.md)."""

    kind: Literal["soft_q"] = "soft_q"
    alpha: float = Field(0.1, gt=0)
    """Temperature α of the KL to the warm start: the optimal policy is π_ref · exp(Q / α), normalised."""
    horizon: int | None = Field(None, ge=1)
    """Sampled tokens a soft Bellman target looks ahead before bootstrapping from V̄; None: to the episode's end."""
    critic_lr: float = Field(1e-4, gt=0)
    """Learning rate of the value head (the critic); faster critics chased 0/1 outcomes and hurt (docs/sac.md)."""
    tau: float = Field(0.1, gt=0, le=1)
    """Polyak rate of the target value network per update (1: a plain copy)."""
    replay_capacity: int = Field(2048, ge=1)
    """Episodes kept (FIFO); failed episodes are never stored."""
    replay_batch: int = Field(128, ge=1)
    """Episodes replayed per update (the newest step's episodes are always in the buffer first)."""
    updates_per_step: int = Field(1, ge=1)
    """Updates per RL step, each on a freshly sampled replay batch."""
    huber: bool = False
    """Huber instead of squared TD loss (bounded gradient)."""


PolicyLoss = Annotated[PPOClip | GSPOLoss | PolicyGradient | SoftQ, Field(discriminator="kind")]

# ---- KL and guards -------------------------------------------------------------------------------------


class KLControl(Frozen):
    """KL to the reference (the RL start) as a loss term or as a reward penalty; ``coef = 0`` turns it off."""

    coef: float = Field(0.0, ge=0)
    estimator: KLEstimator = "k3"
    use: Literal["loss", "reward"] = "loss"


class Guards(Frozen):
    """Stability guards. A tripped guard skips the whole RL step: its updates are rolled back (never applied,
    so never checkpointed nor sent to the engine), it is counted in ``guard/skipped_steps``, and the reason
    is reported. ``None`` disables a check."""

    max_grad_norm: float | None = Field(1e3, gt=0)
    """Pre-clip gradient norm above which the step is skipped (non-finite norms always skip)."""
    max_kl: float | None = Field(None, gt=0)
    """k3 KL(π_θ ‖ π_ref) per token, measured during the update, above which the step is skipped."""
    min_entropy: float | None = Field(None, ge=0)
    max_entropy: float | None = Field(None, gt=0)
    stop_after: int | None = Field(None, ge=1)
    """Stop the run after this many skipped steps in a row (None: never stop)."""


# ---- named algorithms ----------------------------------------------------------------------------------


class NamedAlgorithm(Frozen):
    """A named algorithm: the ``rl`` choices it fixes, as its preset file's ``rl`` section holds them. Applied
    on top of a run's ``rl`` settings, each choice it sets replaces the run's whole (a GAE advantage is GAE's own
    defaults, not the run's GRPO fields merged in); what it leaves unset (None) stays the run's, as does every
    other ``rl`` setting (steps, lr, KL, guards)."""

    advantage: Advantage | None = None
    loss: PolicyLoss
    aggregation: AggregationMode | None = None


AGGREGATIONS: tuple[AggregationMode, ...] = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)
