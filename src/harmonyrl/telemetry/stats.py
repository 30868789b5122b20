"""Statistics for reported figures, in one place: mean, standard error (clustered by task where samples share a task),
seeds, paired and unpaired differences, spreads, interpolated time to a target, and the rule for "learned".

Every benchmark's ``RESULT`` line and the held-out evaluation (``eval/success_se``) use these functions, so a figure
and its noise are computed the same way everywhere. Pure functions on plain floats; nothing here knows a run.

Conventions: a *sample* is one scored episode (0/1 success or any float); a *cluster* is what samples share and so
are not independent of each other (a task's several samples at T=1, a seed's several evaluations). Standard errors
are of the mean; "n" is the number of samples, "clusters" the number of independent units the SE rests on.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

LEARNED_GAIN = 0.10
"""A test-split gain must exceed this (10 points of pass@1) to count as learned ..."""
LEARNED_Z = 2.0
"""... and exceed this many standard errors of the gain."""


@dataclass(frozen=True)
class Estimate:
    """A mean with its standard error.

    ``n``: samples behind it; ``clusters``: independent units the SE rests on (tasks, seeds, or ``n`` for
    independent samples). ``se`` is ``nan`` with fewer than two clusters (no spread to estimate)."""

    mean: float
    se: float
    n: int
    clusters: int
    seeds: tuple[int, ...] = ()
    """The seeds the figure pools (empty where it is one run's)."""

    def as_dict(self) -> dict[str, object]:
        """``{"mean", "se", "n", "clusters", "seeds"}`` for JSON (a ``nan`` SE is written as ``None``)."""
        se = None if math.isnan(self.se) else self.se
        return {"mean": self.mean, "se": se, "n": self.n, "clusters": self.clusters, "seeds": list(self.seeds)}

    def pct(self) -> str:
        """``52.3 % ± 2.1`` (a proportion in percent, SE in points)."""
        return f"{100 * self.mean:.1f} % ± {100 * self.se:.1f}"

    def fields(self, name: str, digits: int = 3) -> str:
        """``name=<mean> name_se=<se>`` for a benchmark's ``RESULT`` line (``nan`` for an SE it has not)."""
        se = "nan" if math.isnan(self.se) else f"{self.se:.{digits}f}"
        return f"{name}={self.mean:.{digits}f} {name}_se={se}"


def mean_se(values: Sequence[float]) -> Estimate:
    """Mean of independent ``values`` ``[n]`` and its standard error ``sd / sqrt(n)`` (sample sd, ``n − 1``).

    Used for seeds: one figure per seed, the seeds independent."""
    if not values:
        raise ValueError("mean_se of no values")
    n = len(values)
    mean = statistics.fmean(values)
    se = statistics.stdev(values) / math.sqrt(n) if n > 1 else math.nan
    return Estimate(mean, se, n, n)


def over_seeds(per_seed: Mapping[int, float]) -> Estimate:
    """One figure per seed ``{seed: value}`` pooled: :func:`mean_se` over the seeds, which it records."""
    seeds = tuple(sorted(per_seed))
    return dataclasses.replace(mean_se([per_seed[s] for s in seeds]), seeds=seeds)


def clustered(groups: Sequence[Sequence[float]]) -> Estimate:
    """Mean of every sample in ``groups`` ``[clusters][samples_in_cluster]`` (e.g. tasks × samples), and its
    cluster-robust standard error: ``sqrt(G / (G − 1) · Σ_g (Σ_i (y_gi − ȳ))²) / N`` over ``G`` clusters and ``N``
    samples. With equal cluster sizes this is the SE of the ``G`` cluster means; with one sample per cluster it is
    the plain ``sd / sqrt(N)`` of independent samples. Empty clusters are ignored."""
    kept = [list(g) for g in groups if len(g) > 0]
    n = sum(len(g) for g in kept)
    if n == 0:
        raise ValueError("clustered of no samples")
    mean = math.fsum(itertools.chain.from_iterable(kept)) / n
    g = len(kept)
    if g < 2:
        return Estimate(mean, math.nan, n, g)
    total = math.fsum(math.fsum(y - mean for y in group) ** 2 for group in kept)
    return Estimate(mean, math.sqrt(g / (g - 1) * total) / n, n, g)


def proportion(successes: int, n: int) -> Estimate:
    """A success rate from ``n`` independent 0/1 samples: ``p`` and ``sqrt(p (1 − p) / n)`` (e.g. greedy
    success, one episode per task)."""
    if n <= 0:
        raise ValueError("proportion of no samples")
    p = successes / n
    return Estimate(p, math.sqrt(p * (1 - p) / n), n, n)


def difference(before: Estimate, after: Estimate) -> Estimate:
    """``after − before`` of two independent estimates: SE ``sqrt(se_a² + se_b²)``. For the same tasks measured
    twice this is conservative (the two are positively correlated); :func:`paired` is exact when the per-task
    figures are at hand."""
    return Estimate(after.mean - before.mean, math.hypot(before.se, after.se), min(before.n, after.n),
                    min(before.clusters, after.clusters))  # fmt: skip


Unit = TypeVar("Unit", str, int)
"""What two paired arms share: a task id or a seed."""


def paired(a: Mapping[Unit, float], b: Mapping[Unit, float]) -> Estimate:
    """Paired comparison of two arms that share units (tasks or seeds): mean and SE of ``b[k] − a[k]`` over the
    keys both have. Pairing removes what the unit adds to both arms (an easy task, a lucky seed)."""
    keys = sorted(a.keys() & b.keys())
    if not keys:
        raise ValueError("paired: the arms share no task or seed")
    return mean_se([b[k] - a[k] for k in keys])


def learned(gain: Estimate, min_gain: float = LEARNED_GAIN, z: float = LEARNED_Z) -> bool:
    """The rule for "learned": the (test-split) gain exceeds ``min_gain`` **and** ``z`` standard errors. A gain
    without a standard error (``nan``) never counts."""
    return gain.mean > min_gain and not math.isnan(gain.se) and gain.mean > z * gain.se


@dataclass(frozen=True)
class Spread:
    """Median and range of repeated timings ``[repeats]``."""

    median: float
    low: float
    high: float
    n: int

    def __str__(self) -> str:
        return f"{self.median:.3g} [{self.low:.3g}–{self.high:.3g}] (n={self.n})"


def spread(values: Sequence[float]) -> Spread:
    """Median, minimum and maximum of ``values`` (at least one)."""
    if not values:
        raise ValueError("spread of no values")
    return Spread(statistics.median(values), min(values), max(values), len(values))


def time_to_target(curve: Sequence[tuple[float, float]], target: float) -> float:
    """The time at which ``curve`` ``[(time, value)]`` (in time order) first reaches ``target``, interpolated
    linearly between the two evaluations around the crossing; 0 if it starts there, ``inf`` if it never does.
    Reading the first evaluation at or above the target instead rounds up to the evaluation interval."""
    if not curve:
        return math.inf
    if curve[0][1] >= target:
        return curve[0][0]
    for (t0, v0), (t1, v1) in itertools.pairwise(curve):
        if v1 >= target:
            return t0 + (target - v0) / (v1 - v0) * (t1 - t0)
    return math.inf
