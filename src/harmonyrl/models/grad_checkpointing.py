"""Activation checkpointing for the trainer's GptOss: each decoder layer's activations are recomputed in the
backward pass instead of stored (transformers' ``activation_checkpointing_enable``, non-reentrant).

transformers checkpoints a layer only in training mode, while the RL update runs the model in eval mode so that
old and new log-probs come from one function (no dropout). :func:`eval_mode` gives both: every module in eval
mode (dropout off) except the decoder layers' own flag, which only switches checkpointing on.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel
from transformers.modeling_layers import GradientCheckpointingLayer


def enable(model: PreTrainedModel) -> None:
    """Recompute each decoder layer in the backward pass (non-reentrant: exact gradients, no input hooks)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.24 (the old name warns)
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def _layers(model: torch.nn.Module) -> list[GradientCheckpointingLayer]:
    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing]


def eval_mode(model: torch.nn.Module) -> None:
    """``model.eval()``, keeping checkpointing on where it is enabled (it needs the layer's ``training`` flag; the
    layer's submodules, dropout included, stay in eval mode)."""
    model.eval()
    for layer in _layers(model):
        layer.training = True  # the flag alone, not .train(): that would turn the submodules' dropout on


def active(model: torch.nn.Module) -> bool:
    """Whether a forward of ``model`` now would checkpoint (and so keep no KV cache: transformers drops it)."""
    return torch.is_grad_enabled() and any(layer.training for layer in _layers(model))
