"""Metric series read back from ``metrics.jsonl`` rows: the data the report's plots are drawn from."""

from __future__ import annotations

Series = dict[str, tuple[list[int], list[float]]]
"""Metric key → (steps, values), in step order."""


def as_float(value: object) -> float | None:
    """Numbers, and the strings JsonlWriter writes for non-finite floats ("nan", "inf"); anything else is not a
    metric."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def collect_series(rows: list[dict[str, object]]) -> Series:
    """Metric key → (steps, values) in step order; a step recorded twice (a resumed run) keeps its last value."""
    by_key: dict[str, dict[int, float]] = {}
    for row in rows:
        step = row["step"]
        assert isinstance(step, int)
        for key, raw in row.items():
            value = as_float(raw)
            if key not in ("step", "phase") and value is not None:
                by_key.setdefault(key, {})[step] = value
    return {k: (sorted(v), [v[s] for s in sorted(v)]) for k, v in by_key.items()}
