"""When a run's sampler and trainer disagree: the report's pointer to ``docs/diagnosing-mismatch.md``.

Three signals, read in the guide's order, each with the threshold the guide gives: the on-policy ratio on the
first minibatch (``train/ratio_max_dev_first_mb``: the trainer recomputing the log-probs it was given must get
ratio 1; anything above fp32 noise means the trainer disagrees with itself), the sampler/trainer mismatch KL
(``mismatch/kl_k3``: matched fp32 kernels sit near 1e-13, a sink-less trainer on large sinks near 0.6; above
1e-3 deserves a look) and MoE routing agreement (``routing/agreement`` below 0.999: the two sides run different
experts, which ``rl.routing_replay=r3`` removes).
"""

from __future__ import annotations

import math

from harmonyrl.telemetry.series import Series

GUIDE = "docs/diagnosing-mismatch.md"
RATIO_DEV_MAX = 1e-5
KL_MAX = 1e-3
AGREEMENT_MIN = 0.999


def _worst(series: Series, key: str, largest: bool) -> tuple[float, int] | None:
    """``(value, step)`` of the largest (or smallest) finite point of ``key``; ``None`` if none was recorded."""
    steps, values = series.get(key, ([], []))
    points = [(v, s) for s, v in zip(steps, values, strict=True) if math.isfinite(v)]
    if not points:
        return None
    return max(points) if largest else min(points)


def mismatch_note(series: Series) -> str | None:
    """One sentence per signal past its threshold, and the guide to read next; ``None`` when all are quiet."""
    parts: list[str] = []
    if (dev := _worst(series, "train/ratio_max_dev_first_mb", largest=True)) and dev[0] > RATIO_DEV_MAX:
        parts.append(
            f"the on-policy ratio on the first minibatch strays from 1 by {dev[0]:.2g} (step {dev[1]}): the "
            "trainer disagrees with itself (nondeterminism, dropout, changing routing)"
        )
    if (kl := _worst(series, "mismatch/kl_k3", largest=True)) and kl[0] > KL_MAX:
        finite = [v for v in series["mismatch/kl_k3"][1] if math.isfinite(v)]
        mean = sum(finite) / len(finite)
        parts.append(
            f"the sampler/trainer mismatch KL reaches {kl[0]:.2g} per token (step {kl[1]}; mean {mean:.2g}; "
            f"matched kernels give ~1e-13, above {KL_MAX:g} deserves a look)"
        )
    if (agree := _worst(series, "routing/agreement", largest=False)) and agree[0] < AGREEMENT_MIN:
        parts.append(
            f"MoE routing agreement falls to {agree[0]:.4f} (step {agree[1]}): sampler and trainer run "
            "different experts (rl.routing_replay=r3 replays the sampler's)"
        )
    if not parts:
        return None
    return f"Sampler and trainer disagree: {'; '.join(parts)}. What to read, in order: {GUIDE} in harmonyrl's source."
