"""Activation checkpointing for the trainer's GptOss: each decoder layer's activations are recomputed in the
backward pass instead of stored (transformers' ``activation_checkpointing_enable``, non-reentrant).

transformers checkpoints a layer only in training mode, while the RL update runs the model in eval mode so that
old and new log-probs come from one function (no dropout). :func:`eval_mode` gives both: every module in eval
mode (dropout off) except the decoder layers' own flag, which only switches checkpointing on.

With every layer's activations recomputed, an update's peak memory is the recomputed layer's temporaries, and
with an eager attention kernel those are ``[B, H, T, T + 1]`` score tensors and their softmax copies (measured:
docs/memory.md). :func:`enable` therefore also runs an eager kernel in query chunks
(:func:`harmonyrl.models.attention.chunk_eager_queries`: the same operations row by row, equal within fp32
rounding). It is a fixed choice made once, not one per pass, so the no-grad passes of an update run the same
kernel as its gradient pass and the PPO ratio of the first minibatch stays exactly 1.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel
from transformers.modeling_layers import GradientCheckpointingLayer

from harmonyrl.models.attention import chunk_eager_queries


def enable(model: PreTrainedModel) -> None:
    """Recompute each decoder layer in the backward pass (non-reentrant: exact gradients, no input hooks), and run
    an eager attention kernel in query chunks (module docstring)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.24 (the old name warns)
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    chunk_eager_queries(model)


def _layers(model: torch.nn.Module) -> list[GradientCheckpointingLayer]:
    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing]


def eval_mode(model: torch.nn.Module) -> None:
    """``model.eval()``, keeping checkpointing on where it is enabled (it needs the layer's ``training`` flag; the
    layer's submodules, dropout included, stay in eval mode)."""
    model.eval()
    for layer in _layers(model):
        layer.training = True  # the flag alone, not .train(): that would turn the submodules' dropout on


def enabled(model: torch.nn.Module) -> bool:
    """Whether ``model``'s layers checkpoint when a gradient is recorded (set up by :func:`enable` and
    :func:`eval_mode`), whatever the grad mode now. A scoring pass follows this, not :func:`active`: the no-grad
    pass of an update must compute what its gradient pass computes (invariant 4), and the gradient pass cannot
    share a prompt's KV cache."""
    return any(layer.training for layer in _layers(model))


def active(model: torch.nn.Module) -> bool:
    """Whether a forward of ``model`` now would checkpoint (and so keep no KV cache: transformers drops it)."""
    return torch.is_grad_enabled() and enabled(model)
