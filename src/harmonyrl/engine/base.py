"""The engine interface. The embedded engine (:mod:`harmonyrl.engine.local`) and the vLLM client
(:mod:`harmonyrl.engine.vllm`) implement it; nothing inherits from it: it is a structural Protocol."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import torch

from harmonyrl.types import Generation, SamplingParams

MetricsWindow = Callable[[float], dict[str, float]]
"""Closes a statistics window: given the window's wall time in seconds, the engine's ``engine/*`` metrics."""


class Engine(Protocol):
    policy_version: int
    """The ``version`` of the last :meth:`sync_weights` (0: the weights the engine started with); every
    generation reports the version it was sampled with (``Generation.policy_version``)."""

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        """Sample a continuation of ``prompt_ids``. Concurrent calls are batched by the engine."""
        ...

    async def sync_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Take new policy weights from the trainer (between RL steps, no generation pending); the generations
        sampled afterwards report ``policy_version == version``."""
        ...

    def metrics_window(self) -> MetricsWindow | None:
        """Open a statistics window now; None if this engine keeps no statistics."""
        ...

    async def close(self) -> None:
        """Stop background work. Pending requests are cancelled."""
        ...
