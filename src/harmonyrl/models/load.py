"""Load any gpt-oss checkpoint folder into an fp32 ``GptOssForCausalLM`` for the trainer, choosing the layout by
what the folder holds.

* **Hugging Face layout**, plain: ``config.json`` (``model_type: gpt_oss``) + ``model.safetensors`` or shards
  with ``model.safetensors.index.json``, in any float dtype (bf16 is upcast to fp32 exactly). This is what
  :func:`harmonyrl.models.tiny_gpt_oss.save_model` writes.
* **Hugging Face layout, MXFP4 experts** (openai/gpt-oss-20b and -120b as published): the expert matrices are
  ``*_blocks`` + ``*_scales`` (:mod:`harmonyrl.models.real` describes the format). transformers' own
  ``Mxfp4Config(dequantize=True)`` path dequantises them on load (``transformers.integrations.mxfp4``; it runs
  on the CPU); they are detected by their tensor names, so a folder whose ``config.json`` lost its
  ``quantization_config`` loads too.
* **OpenAI's original layout** (the repos' ``original/`` folder): :mod:`harmonyrl.models.original`.

Before any weight is read the folder is checked against the model its config implies (names, shapes, shard
files; :func:`harmonyrl.models.real.check_checkpoint`), so a gap is a one-line :class:`CheckpointError` instead of
transformers' silent random init of a missing tensor; transformers' own loading report is checked again after.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from transformers import GptOssConfig, GptOssForCausalLM
from transformers.utils.quantization_config import Mxfp4Config

from harmonyrl.errors import CheckpointError
from harmonyrl.models.original import is_original_layout, load_original
from harmonyrl.models.real import check_checkpoint, first_problem

MXFP4_QUANTIZATION = {"quant_method": "mxfp4"}
# transformers warns that MXFP4 "on CPU ... will dequantize the model to bf16": we ask for the dequantisation and
# it follows the load dtype (fp32 here), so the line would only mislead.
_MXFP4_QUANTIZER_LOGGER = "transformers.quantizers.quantizer_mxfp4"


def load_checkpoint(
    folder: Path, *, dtype: torch.dtype = torch.float32, device: torch.device | None = None
) -> GptOssForCausalLM:
    """The checkpoint in ``folder`` as a model with the eager attention kernel, whatever its layout; a one-line
    :class:`CheckpointError` naming the folder and the cause when it cannot be loaded as it is.

    ``dtype``/``device``: where the weights live (default fp32 on the CPU). A Hugging Face folder is loaded
    straight onto ``device`` in ``dtype`` (MXFP4 experts dequantised there), never whole in fp32 on the host:
    gpt-oss-20b is 84 GB in fp32, 42 GB in bf16.
    """
    folder = Path(folder)
    try:
        if not is_original_layout(folder):
            return _load_hf(folder, dtype, device)
        model = load_original(folder)
        torch.nn.Module.to(model, device=device or torch.device("cpu"), dtype=dtype)  # in place; wraps .to
        return model
    except CheckpointError as e:
        raise CheckpointError(f"cannot load checkpoint '{folder}': {e}") from None


def _load_hf(folder: Path, dtype: torch.dtype, device: torch.device | None) -> GptOssForCausalLM:
    report = check_checkpoint(folder)
    problem = first_problem(report)
    if problem is not None:
        raise CheckpointError(problem)
    config = _hf_config(folder, quantised=bool(report.quantised))
    quiet = logging.getLogger(_MXFP4_QUANTIZER_LOGGER)
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        # output_loading_info makes it a (model, info) pair, which the annotation does not say
        loaded: Any = GptOssForCausalLM.from_pretrained(
            folder,
            config=config,
            dtype=dtype,
            device_map=str(device) if device is not None and device.type != "cpu" else None,
            attn_implementation="eager",
            quantization_config=Mxfp4Config(dequantize=True) if report.quantised else None,
            output_loading_info=True,
        )
    except Exception as e:  # safetensors, JSON and shape errors alike: name the cause in one line
        raise CheckpointError(str(e).splitlines()[0] if str(e) else type(e).__name__) from e
    finally:
        quiet.setLevel(level)
    model, info = loaded
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        if info.get(kind):  # the check above should have caught it: never train on a silently random tensor
            raise CheckpointError(f"transformers reports {kind.replace('_', ' ')}: {sorted(info[kind])[:3]}")
    assert isinstance(model, GptOssForCausalLM)
    return model


def _hf_config(folder: Path, quantised: bool) -> GptOssConfig:
    """The folder's config with ``quantization_config`` set exactly when the tensors are MXFP4: transformers
    dequantises by the config, not by the tensors it meets (without it, blocks are "unexpected" and the expert
    matrices are initialised at random)."""
    config = GptOssConfig.from_pretrained(folder)
    has = isinstance(getattr(config, "quantization_config", None), dict)
    if quantised and not has:
        config.quantization_config = dict(MXFP4_QUANTIZATION)
    elif not quantised and hasattr(config, "quantization_config"):
        del config.quantization_config  # plain tensors saved under a quantised model's config
    return config
