"""Every benchmark still imports against today's package.

Benchmarks are run by hand, not by the suite, so a rename inside ``harmonyrl`` could break one unseen: on
2026-11-26 ``benchmarks/async.py`` failed at import (it wrapped ``loop.save_progress`` after that function moved to
``rl/phase.py``) and nobody knew until a helper ran it. Importing a benchmark runs its module level (its
patches of the trainer, its constants, its dataclasses), not its ``main``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
TOP_LEVEL_SCRIPTS = {"memory_breakdown"}
"""Diagnostics that do their work at module level on ``sys.argv`` (importing one would run it)."""
LIBRARIES = {"trl_adapter"}
"""Modules a benchmark imports, with no ``main`` of their own (``trl_adapter``: what ``vs_trl.py`` gives TRL)."""


@pytest.mark.parametrize("path", sorted(p for p in BENCHMARKS.glob("*.py") if p.stem not in TOP_LEVEL_SCRIPTS),
                         ids=lambda p: p.stem)  # fmt: skip
def test_benchmark_imports(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # benchmarks import each other as plain modules
    name = f"_benchmark_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)  # dataclasses look their module up here
    spec.loader.exec_module(module)
    assert path.stem in LIBRARIES or callable(getattr(module, "main", None)), f"{path.name} has no main()"


def test_every_top_level_script_exists() -> None:
    assert all((BENCHMARKS / f"{stem}.py").exists() for stem in TOP_LEVEL_SCRIPTS | LIBRARIES)
