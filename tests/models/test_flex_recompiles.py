"""One process keeps every compiled flex variant it needs. On CUDA flex runs through one ``torch.compile`` whose
variants (mask function, dtype, grad mode, static-then-dynamic shape) dynamo caps at ``recompile_limit`` (8 by
default); past the cap it runs flex uncompiled, with a log line only, and uncompiled flex materialises the
``[B, H, T, S]`` scores. The exactness check's 12 variants reached the cap (found before the first GPU run). Here
the same compiled callable is driven on the CPU with dynamo's ``eager`` backend (guards and recompiles are
dynamo's, whatever the backend), and reaching the cap is made an error."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch._dynamo
from torch.nn.attention import flex_attention as flex_module

from harmonyrl.models.attention import flex as flex_impl
from harmonyrl.models.attention_check import CASES, check_flex_sink


@pytest.fixture
def eager_compiled_flex(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """``_compiled_flex()`` built with the ``eager`` backend and routed into the CPU path of ``_flex_call``."""
    real_compile = torch.compile

    def compile_eager(fn: Any, **kwargs: Any) -> Any:
        return real_compile(fn, **{**kwargs, "backend": "eager"})

    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 8)  # torch's default, restored afterwards
    monkeypatch.setattr(torch._dynamo.config, "fail_on_recompile_limit_hit", True)
    monkeypatch.setattr(torch, "compile", compile_eager)
    flex_impl._compiled_flex.cache_clear()
    torch._dynamo.reset()
    compiled = flex_impl._compiled_flex()
    monkeypatch.setattr(flex_module, "flex_attention", compiled)  # the CPU branch calls flex.flex_attention
    yield compiled
    flex_impl._compiled_flex.cache_clear()
    torch._dynamo.reset()


def test_every_variant_of_the_exactness_check_stays_compiled(eager_compiled_flex: Any) -> None:
    assert torch._dynamo.config.recompile_limit >= flex_impl.FLEX_RECOMPILE_LIMIT
    records = check_flex_sink("cpu", backward=False)  # 6 cases x 2 dtypes: 12 variants, more than torch's 8
    assert len(records) == 2 * len(CASES)
    assert all(r["ok"] for r in records)


def test_the_limit_is_raised_never_lowered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 8)
    flex_impl.raise_recompile_limit()
    assert torch._dynamo.config.recompile_limit == flex_impl.FLEX_RECOMPILE_LIMIT
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 500)
    flex_impl.raise_recompile_limit()
    assert torch._dynamo.config.recompile_limit == 500
