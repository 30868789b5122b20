"""Which model a plan is for: a published name, a checkpoint folder, or the run config's own model."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from transformers import GptOssConfig

from harmonyrl.config import RunConfig
from harmonyrl.errors import CheckpointError
from harmonyrl.harmony.codecs import VOCAB_SIZES
from harmonyrl.models.real import load_config
from harmonyrl.models.synthetic import GPT_OSS_20B, GPT_OSS_120B
from harmonyrl.models.tiny_gpt_oss import PRESETS, build_config

PUBLISHED = {"gpt-oss-20b": GPT_OSS_20B, "gpt-oss-120b": GPT_OSS_120B}
"""Models a plan knows by name (their published configs)."""


def model_config(run: RunConfig, model: str | None) -> tuple[GptOssConfig, str]:
    """(the model's config, a label) for ``model`` — a name in :data:`PUBLISHED` or a folder holding a gpt-oss
    ``config.json`` — or, without one, the run's ``model.init_from`` or ``model.preset``. A one-line
    :class:`~harmonyrl.errors.CheckpointError` for anything else."""
    if model is None and run.model.init_from is not None:
        model = str(run.model.init_from)
    preset = run.model.preset if model is None else model
    if preset in PRESETS:
        vocab = VOCAB_SIZES[run.model.tokenizer]
        config = build_config(preset, vocab, 0, 1, max_positions=max(1024, run.rollout.max_seq_len))
        return config, f"preset {preset}"
    assert model is not None
    if model.lower() in PUBLISHED:
        with tempfile.TemporaryDirectory() as tmp:  # through the checkpoint reader: the same config a folder gives
            (Path(tmp) / "config.json").write_text(json.dumps(PUBLISHED[model.lower()]))
            return load_config(Path(tmp)), model.lower()
    folder = Path(model)
    if folder.is_dir():
        return load_config(folder), str(folder)
    known = ", ".join([*PUBLISHED, *PRESETS])
    raise CheckpointError(f"unknown model {model!r}: a folder with a gpt-oss config.json, or one of {known}")
