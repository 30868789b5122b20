"""Curriculum: draw training tasks towards a target pass rate, and open harder tasks by schedule.

**Buckets.** Tasks are grouped into buckets. When the environment reports a task's difficulty (a factory with a
``difficulty(task) -> int | None`` method, e.g. the calculator with ``env.levels``), a bucket is a difficulty
level and buckets are ordered from easy to hard; otherwise every task is its own bucket (useful when tasks
repeat: a small ``env.n_train``). Each bucket keeps a running pass rate, measured on the episodes the run
samples anyway: after every step, each group moves its bucket's rate by ``ema`` towards the group's fraction
of passed episodes (reward ≥ ``pass_reward``). A bucket not yet seen has rate ``prior`` (default: the target,
so unseen buckets are tried early).

**Drawing.** Each task is drawn in two stages: a bucket, with probability proportional to
:func:`bucket_weights` (a Gaussian bump of width ``width`` around ``target``, plus a floor so no open bucket
starves), then the bucket's next task in split order. Only the open buckets are drawn: with ``start_levels``
the easiest ``start_levels`` buckets are open at step 0 and one more opens every ``widen_every`` steps
(:func:`open_buckets`); with ``open_at`` the next one also opens as soon as the hardest open bucket's
measured pass rate reaches ``open_at`` (:func:`opened_by_rate`; at most one per step, never closed again).
Randomness is a function of the run seed and the draw's index, and the rates, cursors, draw count and the count
opened by rate are saved with every checkpoint (:meth:`Curriculum.state`): a resumed run draws what an
uninterrupted one would.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

from pydantic import Field, model_validator

from harmonyrl.frozen import Frozen
from harmonyrl.rollout.task_stream import SourceState
from harmonyrl.types import Task, Trajectory

Difficulty = Callable[[Task], "int | None"]
"""A task's difficulty level as the environment reports it (None: not reported)."""


class CurriculumConfig(Frozen):
    """Curriculum task sampling (``rl.curriculum``; docs/curriculum.md). Setting any key turns it on."""

    target: float = Field(0.5, gt=0, lt=1)
    """Pass rate the sampler steers towards: buckets whose running pass rate is near it are drawn most."""
    width: float = Field(0.2, gt=0)
    """Width of the preference: a bucket ``width`` away from the target is drawn e⁻¹ as often as one on it."""
    floor: float = Field(0.05, ge=0, le=1)
    """Smallest relative weight of an open bucket (so every open bucket keeps being measured)."""
    ema: float = Field(0.3, gt=0, le=1)
    """Weight of one group's pass fraction in its bucket's running pass rate."""
    prior: float | None = Field(None, ge=0, le=1)
    """Pass rate assumed for a bucket not yet seen (null: the target, so unseen buckets are tried early)."""
    pass_reward: float = Field(0.5)
    """An episode with at least this reward counts as passed."""
    start_levels: int | None = Field(None, ge=1)
    """Difficulty levels open at the first RL step, easiest first (null: all); needs an env that reports
    difficulty (e.g. the calculator's ``env.levels``)."""
    widen_every: int = Field(0, ge=0)
    """RL steps between opening the next harder level (0: never widen beyond ``start_levels`` by schedule)."""
    open_at: float | None = Field(None, gt=0, le=1)
    """Also open the next harder level once the hardest open level's measured pass rate reaches this (null: by
    schedule only)."""

    @model_validator(mode="after")
    def _widen_needs_start(self) -> CurriculumConfig:
        for name, value in (("widen_every", self.widen_every or None), ("open_at", self.open_at)):
            if value is not None and self.start_levels is None:
                raise ValueError(f"rl.curriculum.{name} needs rl.curriculum.start_levels (how many levels open first)")
        return self


def bucket_weights(rates: Sequence[float], target: float, width: float, floor: float) -> list[float]:
    """Probabilities of drawing each bucket: ``floor + (1 - floor) * exp(-((rate - target) / width)²)``,
    normalised to sum to 1."""
    raw = [floor + (1 - floor) * math.exp(-(((r - target) / width) ** 2)) for r in rates]
    total = sum(raw)
    return [w / total for w in raw]


def open_buckets(step: int, n_buckets: int, start: int | None, widen_every: int) -> int:
    """How many buckets (easiest first) are open at RL step ``step`` (0-based)."""
    if start is None:
        return n_buckets
    widened = step // widen_every if widen_every > 0 else 0
    return min(n_buckets, start + widened)


def opened_by_rate(open_now: int, n_buckets: int, hardest_rate: float | None, open_at: float | None) -> int:
    """Buckets open after a step: one more than ``open_now`` when the hardest open bucket's measured pass rate
    (None: not measured yet) reached ``open_at`` (None: never by rate)."""
    if open_at is None or hardest_rate is None or hardest_rate < open_at:
        return open_now
    return min(n_buckets, open_now + 1)


def updated_rate(rate: float, passed: float, ema: float) -> float:
    """A running pass rate moved ``ema`` of the way towards one group's pass fraction ``passed``."""
    return rate + ema * (passed - rate)


class Curriculum:
    """A :class:`~harmonyrl.rollout.task_stream.TaskSource` that draws towards ``cfg.target`` (module docstring)."""

    def __init__(self, tasks: Sequence[Task], difficulty: Difficulty | None, cfg: CurriculumConfig, seed: int) -> None:
        if not tasks:
            raise ValueError("the training split is empty")
        levels = {t.id: difficulty(t) for t in tasks} if difficulty is not None else {}
        self.levelled = bool(levels) and all(v is not None for v in levels.values())
        if cfg.start_levels is not None and not self.levelled:
            raise ValueError(
                "rl.curriculum.start_levels needs an env that reports task difficulty (e.g. env.levels for the "
                "calculator); this env does not"
            )
        self._bucket_of: dict[str, str] = {t.id: str(levels[t.id]) if self.levelled else t.id for t in tasks}
        members: dict[str, list[Task]] = {}
        for t in tasks:
            members.setdefault(self._bucket_of[t.id], []).append(t)
        order = sorted(members, key=int) if self.levelled else list(members)
        self._members = {b: members[b] for b in order}
        self._cfg, self._seed = cfg, seed
        self.rates: dict[str, float] = {}
        self.cursors: dict[str, int] = {}
        self.draws = 0
        self.opened = len(self._members)
        """Buckets open at the last draw."""
        self.unlocked = 0
        """Buckets open after the last observed step, counting the one ``open_at`` may have added: a level opened
        by rate stays open whatever the schedule says."""

    def rate(self, bucket: str) -> float:
        """The bucket's running pass rate (the prior until it has been seen)."""
        prior = self._cfg.target if self._cfg.prior is None else self._cfg.prior
        return self.rates.get(bucket, prior)

    def draw(self, step: int, n: int) -> list[Task]:
        """``n`` tasks: a bucket by :func:`bucket_weights` among the open ones, then that bucket's next task."""
        cfg = self._cfg
        self.opened = max(open_buckets(step, len(self._members), cfg.start_levels, cfg.widen_every), self.unlocked)
        names = list(self._members)[: self.opened]
        weights = bucket_weights([self.rate(b) for b in names], cfg.target, cfg.width, cfg.floor)
        chosen = []
        for _ in range(n):
            rng = random.Random(self._seed * 1_000_003 + self.draws)
            bucket = rng.choices(names, weights)[0]
            cursor = self.cursors.get(bucket, 0)
            members = self._members[bucket]
            chosen.append(members[cursor % len(members)])
            self.cursors[bucket] = cursor + 1
            self.draws += 1
        return chosen

    def observe(self, trajectories: Sequence[Trajectory]) -> dict[str, float]:
        """Move each group's bucket rate towards the group's pass fraction (healthy episodes only); metrics."""
        groups: dict[int, list[Trajectory]] = {}
        for t in trajectories:
            if t.failure is None:
                groups.setdefault(t.group_id, []).append(t)
        for group in groups.values():
            bucket = self._bucket_of.get(group[0].task_id)
            if bucket is None:  # not a training task of this run (cannot happen with the run's own source)
                continue
            passed = sum(t.reward >= self._cfg.pass_reward for t in group) / len(group)
            self.rates[bucket] = updated_rate(self.rate(bucket), passed, self._cfg.ema)
        hardest = list(self._members)[self.opened - 1]
        self.unlocked = opened_by_rate(self.opened, len(self._members), self.rates.get(hardest), self._cfg.open_at)
        return self._metrics(trajectories)

    def _metrics(self, trajectories: Sequence[Trajectory]) -> dict[str, float]:
        metrics = {"curriculum/buckets_seen": float(len(self.rates)), "curriculum/open_buckets": float(self.opened)}
        if not self.levelled:
            return metrics
        ran = [int(self._bucket_of[t.task_id]) for t in trajectories if t.task_id in self._bucket_of]
        metrics["curriculum/mean_level"] = sum(ran) / len(ran) if ran else 0.0
        metrics |= {f"curriculum/rate_level_{b}": self.rate(b) for b in self._members}
        return metrics

    def state(self) -> SourceState:
        """Rates, cursors, the draw count and the open count kept for ``open_at``, as plain containers."""
        return {
            "kind": "curriculum",
            "rates": dict(self.rates),
            "cursors": dict(self.cursors),
            "draws": self.draws,
            "unlocked": self.unlocked,
        }

    def load(self, state: SourceState) -> None:
        """Continue from :meth:`state`'s output."""
        rates, cursors, draws = state["rates"], state["cursors"], state["draws"]
        unlocked = state.get("unlocked", 0)  # absent in checkpoints from before ``open_at``: nothing opened by rate
        if not isinstance(rates, dict) or not isinstance(cursors, dict) or not isinstance(draws, int):
            raise ValueError("the checkpoint's curriculum state is malformed")
        if not isinstance(unlocked, int):
            raise ValueError("the checkpoint's curriculum state is malformed")
        self.rates = {str(k): float(v) for k, v in rates.items()}
        self.cursors = {str(k): int(v) for k, v in cursors.items()}
        self.draws, self.unlocked = draws, unlocked
