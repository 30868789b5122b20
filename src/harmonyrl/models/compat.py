"""The one place that knows how the installed ``transformers`` spells its KV cache.

transformers 5.24 renamed the forward argument and output field ``past_key_values`` to ``cache`` (the old name
warns on every call and goes away in 5.40); earlier 5.x releases only know ``past_key_values``. We support both
(``transformers>=5,<6``), so callers ask here instead of spelling either name.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any


@functools.cache
def cache_kwarg(fn: Callable[..., Any]) -> str:
    """The name under which ``fn`` (a model's ``forward``, a mask builder) takes a KV cache."""
    return "cache" if "cache" in inspect.signature(fn).parameters else "past_key_values"


def output_cache(output: Any) -> Any:
    """The KV cache a model call returned (``None`` if it returned none)."""
    cache = output.get("cache") if hasattr(output, "get") else None
    return cache if cache is not None else getattr(output, "past_key_values", None)
