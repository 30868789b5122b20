"""Opening a run under torchrun: rank 0 owns the run folder, the other ranks follow it.

Rank 0 opens (or resumes, rewinding the tracked files) the run folder exactly as a single process does
(:func:`harmonyrl.run.setup.open_run`); the other ranks wait for it, then read what they need: the saved
position (read only) and a model of the right shape. Their weights do not matter: the learner's sharded copy is
filled from rank 0's (:func:`harmonyrl.distributed.fsdp.sharded_copy`). When rank 0 cannot open the run (a user
error: an existing folder, a bad checkpoint), the others stop quietly with :class:`RankZeroStopped`; rank 0
reports the error in its one line.
"""

from __future__ import annotations

from pathlib import Path

from transformers import GptOssForCausalLM

from harmonyrl.config import RunConfig
from harmonyrl.distributed.world import World, broadcast
from harmonyrl.harmony.codecs import RunCodec
from harmonyrl.run.resume import Progress, load_progress
from harmonyrl.run.setup import make_model, open_run


class RankZeroStopped(RuntimeError):
    """Rank 0 stopped before the run started; this rank leaves without a word (rank 0 says why)."""


def open_run_on(
    world: World, config: RunConfig, tok: RunCodec, resume: bool, overwrite: bool = False
) -> tuple[Path, GptOssForCausalLM, Progress | None]:
    """:func:`open_run` on rank 0; on the others the same run folder, a model and the saved position."""
    if not world.distributed:
        return open_run(config, tok, resume, overwrite)
    if world.is_main:
        try:
            opened = open_run(config, tok, resume, overwrite)
        except BaseException:
            broadcast(False, world)
            raise
        broadcast(True, world)
        return opened
    ready: bool = broadcast(None, world)
    if not ready:
        raise RankZeroStopped("rank 0 could not open the run")
    run_dir = config.output_dir / str(config.run_name)
    saved = load_progress(run_dir) if resume else None
    if saved is not None:
        saved.state.rngs.restore()
    return run_dir, make_model(config, tok), saved
