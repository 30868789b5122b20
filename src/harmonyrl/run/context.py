"""What every phase of ``harmonyrl train`` reads and writes through: the run's config, folder, model, codec, env,
metrics writers, progress display, the process's place in a torchrun launch, the run's clock and a caller's hooks."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from transformers import GptOssForCausalLM

from harmonyrl.config import RunConfig
from harmonyrl.distributed.world import World
from harmonyrl.envs.base import EnvFactory
from harmonyrl.harmony.codecs import RunCodec
from harmonyrl.run.checkpoint_files import CheckpointFiles
from harmonyrl.run.clock import RunClock
from harmonyrl.run.hooks import NO_HOOKS, RunHooks
from harmonyrl.telemetry.progress import StepProgress
from harmonyrl.telemetry.writers import MetricsWriter


@dataclass(frozen=True)
class RunContext:
    """One open run. ``model`` is rank 0's plain policy (under torchrun the trained shards are gathered into it);
    ``files`` are copied beside the weights of every checkpoint (tokenizer, resolved config)."""

    config: RunConfig
    console: Console
    run_dir: Path
    model: GptOssForCausalLM
    tok: RunCodec
    factory: EnvFactory
    files: CheckpointFiles
    writer: MetricsWriter
    progress: StepProgress
    world: World
    clock: RunClock
    """The run's time so far, resumes included (recorded in every ``checkpoints/last``)."""
    hooks: RunHooks = NO_HOOKS
    """A caller's callbacks (:mod:`.run_hooks`): evaluations and completed RL steps."""
