"""The fuzz tests' one hypothesis profile: deterministic examples, so CI sees the same inputs on every run."""

from __future__ import annotations

from hypothesis import HealthCheck, Phase, settings


def fuzz(examples: int, *, shrink: bool = True) -> settings:
    """``examples`` deterministic examples (a function of the test, not of a seed or a database). ``shrink=False``
    for slow examples (each a resume): the failing input is readable as it is."""
    phases = (Phase.explicit, Phase.generate, *((Phase.shrink,) if shrink else ()))
    return settings(
        max_examples=examples,
        phases=phases,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
