"""The engine interface. The embedded engine implements it; an HTTP client for OpenAI-compatible
servers can implement it too. Nothing inherits from it: it is a structural Protocol."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import torch

from harmonyrl.types import Generation, SamplingParams


class Engine(Protocol):
    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        """Sample a continuation of ``prompt_ids``. Concurrent calls are batched by the engine."""
        ...

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Take new policy weights from the trainer (called between RL steps, engine idle)."""
        ...

    async def close(self) -> None:
        """Stop background work. Pending requests are cancelled."""
        ...
