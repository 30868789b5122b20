"""The ``model`` section: which tiny GPT-OSS (or checkpoint) trains, with which kernel, vocabulary and memory
savers (LoRA, bf16, activation checkpointing)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from harmonyrl.frozen import Frozen, checkpoint_folder
from harmonyrl.harmony.codecs import TokenizerName

LoraTarget = Literal["q_proj", "k_proj", "v_proj", "o_proj", "experts"]
CUDA_ONLY_ATTENTION: frozenset[str] = frozenset({"harmonyrl_flex_sink"})
"""``model.attention`` kernels with no backward on the CPU (``harmonyrl.models.attention.CUDA_TRAINING_ONLY``, named
here without importing transformers; a test keeps the two equal)."""


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
    attention: Literal[
        "eager", "harmonyrl_eager", "harmonyrl_sink_sdpa", "harmonyrl_sinkless", "harmonyrl_flex_sink"
    ] = "harmonyrl_eager"
    """Trainer attention kernel: transformers' eager reference, the same forward with a softmax backward independent
    of the thread count (the default: a run's bits then do not depend on the load), the fused exact sink kernel, a
    deliberately sink-less one (reproduces the sampler/trainer mismatch), or the CUDA kernel ``harmonyrl_flex_sink``
    (exact, O(T) memory, sliding windows skipped; torch flex attention, compiled on first use; CUDA only for
    training: ``device=cpu`` refuses it); see ``harmonyrl.models.attention``."""
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
    """Trainer compute precision: bf16 runs the trainer's forward passes under autocast; what trains (a full
    fine-tune's weights, LoRA adapters, value head) and the optimizer stay fp32; with LoRA the frozen base is kept
    in bf16."""
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
