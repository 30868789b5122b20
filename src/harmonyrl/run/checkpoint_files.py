"""What a checkpoint carries besides weights and trainer state, and reading it back.

Every checkpoint folder harmonyrl writes (``checkpoints/{sft,last,final}``) also holds:

* the tokenizer in transformers' layout (``tokenizer.json``, ``tokenizer_config.json``,
  ``special_tokens_map.json``), harmony control tokens included, so ``AutoTokenizer.from_pretrained(folder)``
  works beside ``AutoModelForCausalLM.from_pretrained(folder)``;
* :data:`RUN_CONFIG_FILE`, the resolved run config the weights were trained with. ``harmonyrl eval`` reads
  its ``env`` section so a checkpoint is evaluated on what it learned, not on the default environment.

The files are written into the checkpoint's temporary folder before it is renamed into place, so they are
as atomic as the weights (see :mod:`harmonyrl.run.checkpoint`).
"""

from __future__ import annotations

import functools
import tempfile
from dataclasses import dataclass
from pathlib import Path

from harmonyrl.config import ConfigError, RunConfig, dump_config, load_config
from harmonyrl.harmony.codecs import RunCodec, save_pretrained

RUN_CONFIG_FILE = "harmonyrl_config.yaml"
"""The resolved run config, in a checkpoint folder (the run folder's ``config.yaml`` holds the same)."""


@dataclass(frozen=True)
class CheckpointFiles:
    """The run's config and tokenizer, written beside the weights of every checkpoint of the run."""

    config: RunConfig
    tokenizer: RunCodec

    @functools.cached_property
    def contents(self) -> dict[str, bytes]:
        """File name → bytes, rendered once per run: RL saves ``checkpoints/last`` after every step, and building
        the transformers tokenizer each time would cost ~50 ms a step (o200k_harmony's: seconds)."""
        with tempfile.TemporaryDirectory() as tmp:
            save_pretrained(self.tokenizer, tmp)
            files = {p.name: p.read_bytes() for p in Path(tmp).iterdir()}
        return files | {RUN_CONFIG_FILE: dump_config(self.config).encode("utf-8")}

    def write(self, folder: Path) -> None:
        """Write the tokenizer (transformers layout) and :data:`RUN_CONFIG_FILE` into ``folder``."""
        for name, data in self.contents.items():
            (folder / name).write_bytes(data)


@dataclass(frozen=True)
class Recorded:
    """The run config a checkpoint was trained with, and where it was read from (for messages)."""

    config: RunConfig
    source: Path


def record_path(checkpoint: Path) -> Path | None:
    """Where the training record of ``checkpoint`` is: its own :data:`RUN_CONFIG_FILE`, else (a checkpoint
    written before checkpoints carried one) the ``config.yaml`` of the run folder it sits in; None if neither."""
    own = checkpoint / RUN_CONFIG_FILE
    if own.is_file():
        return own
    run_config = checkpoint.parent.parent / "config.yaml"
    if checkpoint.parent.name == "checkpoints" and run_config.is_file():
        return run_config
    return None


def read_record(checkpoint: Path) -> Recorded | None:
    """The run config ``checkpoint`` was trained with, or None when it records none (a plain transformers
    folder). Raises :class:`ConfigError` (one line) when a record exists but is not a valid run config."""
    path = record_path(checkpoint)
    if path is None:
        return None
    try:
        return Recorded(load_config(path), path)
    except ConfigError as e:
        raise ConfigError(f"training record '{path}' is not a valid run config: {e}") from None
