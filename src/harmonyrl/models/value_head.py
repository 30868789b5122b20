"""The value head for critic-based estimators (GAE / A2C).

A linear head on the policy's last hidden state (shared trunk, as in small-scale PPO for language models):
one forward pass yields logits and values, and the value loss shapes the shared representation too. It is
zero-initialised, so V ≡ 0 at the start and the first advantages are the plain returns rather than noise.
"""

from __future__ import annotations

import torch


class ValueHead(torch.nn.Module):
    """``[..., hidden]`` → ``[..., 1]`` state values (fp32)."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(self.proj.weight)
        torch.nn.init.zeros_(self.proj.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        value: torch.Tensor = self.proj(hidden.float())
        return value
