"""The ``rollout`` section: how many episodes a step samples, their budgets, the engine, and what a faulting
environment costs."""

from __future__ import annotations

from pydantic import Field

from harmonyrl.engine.config import EngineConfig, LocalEngineConfig
from harmonyrl.frozen import Frozen


class FaultBreakerConfig(Frozen):
    """Stop a run whose episodes keep faulting instead of masking its steps away (see rl/fault_breaker.py)."""

    max_fraction: float = Field(0.5, ge=0, le=1)
    """A step is faulted when more than this fraction of its episodes ends in an environment fault (1: never)."""
    consecutive_steps: int = Field(3, ge=1)
    """The run stops after this many faulted RL steps in a row, naming the dominant failure class."""


class RolloutConfig(Frozen):
    tasks_per_step: int = Field(8, ge=1)
    """Distinct tasks per RL step."""
    group_size: int = Field(16, ge=1)
    """Episodes per task (the group for group-relative advantages)."""
    max_turns: int = Field(4, ge=1)
    """Assistant turns per episode before it is truncated."""
    max_new_tokens: int = Field(64, ge=1)
    """Token budget of one assistant turn."""
    max_seq_len: int = Field(512, ge=32)
    """Token budget of a whole episode; beyond it the episode is truncated."""
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0)
    engine: EngineConfig = LocalEngineConfig()
    """The engine that samples: the embedded one (``kind: local``) or a vLLM server (``kind: vllm``)."""
    episode_timeout_s: float | None = Field(600.0, gt=0)
    """Wall-clock budget of one episode (null: none). On expiry the running tool or sandbox is cancelled and the
    episode is an ``episode_timeout`` environment fault (masked, counted). Generous: it is for hangs, not pacing."""
    retry_faulted_groups: int = Field(0, ge=0, le=10)
    """Run the environment-faulted episodes of a group again, up to this many rounds (same seeds); what still
    faults stays masked. Metrics: ``rollout/group_retries``, ``rollout/faulted_groups``."""
    fault_breaker: FaultBreakerConfig = FaultBreakerConfig()
    """When a run stops because its environment keeps faulting (checked after group retries)."""

    @property
    def episodes_per_step(self) -> int:
        return self.tasks_per_step * self.group_size
