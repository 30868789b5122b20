"""The settings of rewards beyond code checks: the ``reward`` section of a run (a reward model and a judge scoring its
episodes) and ``harmonyrl rm train`` (training a reward model on preference pairs). docs/rewards.md."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from harmonyrl.engine.config import VllmEngineConfig
from harmonyrl.frozen import Frozen, checkpoint_folder
from harmonyrl.harmony.codecs import TokenizerName
from harmonyrl.rewards.files import FORMAT, HEAD_FILE, META_FILE

DEFAULT_RUBRIC = (
    "You grade how well an answer follows every instruction in the user's request. "
    "Reply on the final channel with only an integer score from 0 (ignores the instructions) to {max_score} "
    "(follows every one)."
)


class JudgeConfig(Frozen):
    """An LLM judge (RLAIF): a harmony prompt with a rubric, answered by a model through the Engine protocol."""

    checkpoint: Path | None = None
    """The judge's gpt-oss checkpoint, served by its own embedded engine; null: the policy's engine judges."""
    server: VllmEngineConfig | None = None
    """A vLLM server of its own serving the judge (a model of the run's vocabulary), e.g.
    ``reward.judge.server.url=http://127.0.0.1:8001 reward.judge.server.model=judge
    reward.judge.server.weight_sync=none``; never sent the policy's weights. null: see ``checkpoint``."""
    weight: float = Field(1.0, ge=0)
    """Weight of the judge's score (in [0, 1]: the parsed score / max_score) in the episode reward."""
    rubric: str = Field(DEFAULT_RUBRIC, min_length=1)
    """The judge's developer instructions; ``{max_score}`` is filled in."""
    max_score: int = Field(10, ge=1)
    """The top of the score scale the judge is asked for; a reply above it is a parse failure."""
    max_new_tokens: int = Field(16, ge=1)
    """Token budget of one verdict."""
    cache_size: int = Field(65536, ge=0)
    """Verdicts kept per (prompt, answer); a repeat is not judged again (0: no cache)."""

    @field_validator("checkpoint")
    @classmethod
    def _is_checkpoint(cls, path: Path | None) -> Path | None:
        return checkpoint_folder(path)

    @model_validator(mode="after")
    def _one_judge_model(self) -> JudgeConfig:
        if self.checkpoint is not None and self.server is not None:
            raise ValueError("reward.judge: give checkpoint (an embedded judge) or server (a vLLM judge), not both")
        if self.server is not None and self.server.weight_sync != "none":
            raise ValueError(
                "reward.judge.server.weight_sync must be none: the judge keeps its own weights, the policy's are "
                "never sent to it"
            )
        return self


class RewardConfig(Frozen):
    """Reward terms scored after the env's own (code-checked) ones, each weighted and logged as ``reward/<term>``."""

    model: Path | None = None
    """A reward model folder (``harmonyrl rm train``) whose score joins every episode's reward (null: none)."""
    model_weight: float = Field(1.0, ge=0)
    """Weight of the reward model's score (an unbounded logit) in the episode reward."""
    model_batch: int = Field(16, ge=1)
    """Episodes the reward model scores per forward pass (in a worker thread, off the event loop)."""
    env_weight: float = Field(1.0, ge=0)
    """Weight of the env's own code-checked reward (0: train on the learned or judged reward alone)."""
    judge: JudgeConfig | None = None
    """An LLM judge scoring every episode (null: none). Setting any key turns it on, e.g. ``reward.judge.weight=1``."""

    @field_validator("model")
    @classmethod
    def _is_reward_model(cls, path: Path | None) -> Path | None:
        if path is None:
            return None
        try:
            reward_model_tokenizer(path)
        except ValueError as e:  # a custom error: the message reads without pydantic's "Value error, "
            raise PydanticCustomError("reward_model", "{reason}", {"reason": str(e)}) from None
        return path

    @property
    def active(self) -> bool:
        """Anything besides the env's own reward, or the env's reward reweighted."""
        return self.model is not None or self.judge is not None or self.env_weight != 1.0


def reward_model_tokenizer(path: Path) -> str:
    """The tokenizer a reward model folder was trained with; ``ValueError`` (one line) if it is not such a folder."""
    if not ((path / META_FILE).is_file() and (path / HEAD_FILE).is_file()):
        raise ValueError(f"'{path}' is not a reward model folder (no {META_FILE}; harmonyrl rm train makes one)")
    try:
        meta = json.loads((path / META_FILE).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"'{path / META_FILE}' is not readable JSON: {e}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or not isinstance(meta.get("tokenizer"), str):
        raise ValueError(f"'{path / META_FILE}' is not a {FORMAT} file")
    return str(meta["tokenizer"])


class RMTrainConfig(Frozen):
    """``harmonyrl rm train``: a Bradley–Terry reward model on preference pairs."""

    data: Path
    """Preference pairs: JSONL, parquet or a datasets folder in TRL's prompt/chosen/rejected format."""
    out: Path = Path("runs/rm")
    """Run folder (must be new): ``config.yaml``, ``metrics.jsonl``, ``summary.json``, the model in ``checkpoint/``."""
    init_from: Path | None = None
    """Policy checkpoint whose trunk starts the reward model (null: a fresh ``preset`` model)."""
    preset: Literal["nano", "micro", "small"] = "micro"
    """Size of a fresh trunk (ignored with ``init_from``)."""
    tokenizer: TokenizerName = "harmonyrl_bpe"
    """Vocabulary; must be the one of the policy the reward model will score."""
    steps: int = Field(200, ge=1)
    """Optimizer steps."""
    batch_size: int = Field(16, ge=1)
    """Pairs per step."""
    lr: float = Field(1e-4, gt=0)
    """AdamW learning rate (trunk and head)."""
    max_grad_norm: float = Field(1.0, gt=0)
    """Gradients are clipped to this total 2-norm before each step (a non-finite loss or norm skips the step)."""
    centring: float = Field(0.0, ge=0)
    """Reward centring coefficient: adds ``centring · (r_c + r_r)²`` to the loss (0: off)."""
    held_out: float = Field(0.1, gt=0, lt=1)
    """Fraction of the prompts whose pairs are held out for accuracy and calibration (split by prompt)."""
    eval_every: int = Field(50, ge=1)
    """Steps between held-out evaluations (and one at the end)."""
    max_len: int = Field(512, ge=16)
    """Longest input in tokens; longer pairs lose their oldest prompt tokens."""
    seed: int = 0
    threads: int = Field(0, ge=0)
    """torch threads (0: as many as are free)."""

    @model_validator(mode="after")
    def _init_is_checkpoint(self) -> RMTrainConfig:
        if self.init_from is not None and not (self.init_from / "config.json").is_file():
            raise ValueError(f"init_from: '{self.init_from}' is not a checkpoint folder (no config.json inside)")
        return self
