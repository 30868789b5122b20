"""The reference policy of RL (the KL penalty, the KL guard and ``train/kl_ref_k3``): the policy as RL began.

Full fine-tuning keeps a frozen copy of the start (sharded like the policy under torchrun). With LoRA the
reference is *the policy's own module* with its trained adapter switched off (:func:`harmonyrl.models.lora.run_as`),
never a copy: for gpt-oss-20b a copy was 84 GB of fp32 beside the trainer (docs/memory.md). Which adapters the
reference runs with depends on where RL started:

* from untrained adapters (B = 0: a fresh run with ``sft.steps=0``, e.g. ``model.init_from`` a released
  checkpoint): the base alone, adapters off;
* from trained adapters (a LoRA SFT warm start): the base with a frozen adapter holding the start's adapter
  weights (:func:`harmonyrl.models.lora.add_frozen_adapter`, adapter-sized). A resumed run reads them from the
  SFT checkpoint's ``lora.safetensors`` (:func:`rl_start_adapters`), the same fp32 values the fresh run copied.

Either way the reference computes ``Wx + B₀(A₀x)`` where the merged copy computed ``(W + B₀A₀)x``: the same
function, to fp32 rounding (``tests/rl/test_reference.py``).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch

from harmonyrl.distributed.fsdp import sharded_copy
from harmonyrl.distributed.world import SINGLE, World
from harmonyrl.errors import CheckpointError
from harmonyrl.models.lora import (
    ADAPTER_FILE,
    REFERENCE,
    adapter_state_dict,
    add_frozen_adapter,
    has_lora,
    is_zero_update,
    run_as,
)


@dataclass(frozen=True)
class Reference:
    """A frozen reference policy: ``module`` run inside :meth:`scoring`."""

    module: torch.nn.Module
    adapters_of_policy: bool = False
    """True: ``module`` is the LoRA policy itself, run with its trained adapter off and ``adapter`` on."""
    adapter: str | None = None
    """The frozen adapter the reference runs (None: the base alone); only with ``adapters_of_policy``."""

    @contextmanager
    def scoring(self) -> Iterator[torch.nn.Module]:
        """The module computing the reference's log-probs (the policy's adapters restored on exit)."""
        with run_as(self.module, self.adapter) if self.adapters_of_policy else nullcontext(self.module) as module:
            yield module


def reference_for(
    model: torch.nn.Module, world: World = SINGLE, start: dict[str, torch.Tensor] | None = None
) -> Reference:
    """The reference policy of RL starting (or resumed) with ``model``.

    LoRA: ``model`` itself, its adapters switched (module docstring); ``start`` is the trained adapter's weights
    when RL began if ``model`` no longer holds them (a resume, :func:`rl_start_adapters`), None when it does.
    Full fine-tuning: a frozen copy (under torchrun, sharded)."""
    if has_lora(model):
        adapters = start if start is not None else {k: v.detach().clone() for k, v in adapter_state_dict(model).items()}
        if is_zero_update(adapters):
            return Reference(model, adapters_of_policy=True)
        add_frozen_adapter(model, adapters)
        return Reference(model, adapters_of_policy=True, adapter=REFERENCE)
    ref = sharded_copy(model, world) if world.distributed else copy.deepcopy(model)
    ref.eval().requires_grad_(False)
    return Reference(ref)


def rl_start_adapters(run_dir: Path, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The LoRA adapters RL started from in ``run_dir``: the SFT checkpoint's, else (no warm start ran) untrained
    ones, i.e. a zero update (zeros shaped like ``model``'s adapters), on ``model``'s device."""
    own = adapter_state_dict(model)
    sft = run_dir / "checkpoints" / "sft"
    if not (sft / "config.json").is_file():
        return {k: torch.zeros_like(v) for k, v in own.items()}
    if not (sft / ADAPTER_FILE).is_file():
        raise CheckpointError(f"'{sft}' has no {ADAPTER_FILE}: the LoRA adapters RL started from (the reference)")
    from safetensors.torch import load_file

    device = next(iter(own.values())).device
    return load_file(sft / ADAPTER_FILE, device=str(device))
