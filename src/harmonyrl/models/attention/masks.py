"""The masks transformers hands the harmonyrl kernels, read one way: a boolean "may attend" ``[B|1, 1, T, S]``."""

from __future__ import annotations

from typing import Any

import torch
from transformers.masking_utils import sdpa_mask


def keep_mask(attention_mask: torch.Tensor | None, s: int) -> torch.Tensor | None:
    """HF's mask as boolean "may attend" ``[B|1, 1, T, S]`` (it may arrive additive or boolean)."""
    if attention_mask is None:
        return None
    mask = attention_mask[..., :s]
    return mask if mask.dtype == torch.bool else mask == 0


def boolean_mask(*args: Any, **kwargs: Any) -> torch.Tensor | None:
    """HF's boolean sdpa mask. HF returns None for a purely causal mask with ``T == S`` (or a single query, which
    sees every key) so that the kernel can skip the masked blocks; sliding-window layers whose window binds
    and padded batches always get the mask written out."""
    return sdpa_mask(*args, **kwargs)
