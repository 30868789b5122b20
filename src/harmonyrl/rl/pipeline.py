"""Rollouts ahead of the trainer with bounded staleness (``rl.async.max_staleness`` = k, docs/async.md).

**Schedule.** Policy version v is the weights after v RL steps. With k = 0 (the default) step s trains on a batch
sampled by the current weights and the weights go to the engine after each applied update: today's loop, the
same calls in the same order. With k > 0 the batch of step s is sampled by version ``max(0, s - k)``, so while
step s trains (in a worker thread) the engine collects batches s+1 … s+k, whose versions already exist.

**Engine copies.** At most k + 1 batches are in flight (batch s needs version s - k, which exists only once batch
s - k - 1 has been trained on), so an engine that can :meth:`~harmonyrl.engine.local.engine.LocalEngine.replica`
itself gets k + 1 copies and batch s runs on copy ``s mod (k + 1)``, free by the same argument. The copies share
the event loop: one batch's tool waits are filled by another batch's decode steps. Before a batch starts, its copy
loads the batch's version from a snapshot if it holds another (at most k + 1 snapshots are kept; nothing is
pending on that copy then, as ``sync_weights`` needs). An engine without ``replica`` (the vLLM client) runs the
batches one after another in step order on its one weight copy.

**Staleness policy: drop and count.** A sample whose version lags the trainer's by more than k is never
trained on (invariant 10): it is dropped from the step and counted in ``async/dropped``. With this schedule every
batch's staleness is ``min(s, k)`` by construction, so the check guards the invariant rather than firing. By
default an episode never spans a weight load; with ``rl.async.partial`` (:mod:`harmonyrl.rl.partial`) its later
turns take the versions published while it runs, the copies hold one live version each, and staleness is checked
per token.

**Determinism, resume.** A batch depends only on its version's weights and its step's seeds, never on timing,
so the in-flight batches are *regenerated* after a resume: the checkpoint carries the snapshots the next batches
need (:meth:`Pipeline.state`), and the engine's version counter (recorded in every trajectory).

**Why a thread for the update.** The embedded engine must run on the event loop's thread (its module docstring);
the update is torch work that releases the GIL in its kernels, so it runs in ``asyncio.to_thread`` while the
loop keeps decoding and running tools. The worker thread uses the run's thread count, so the update's numerics
are the same as on the main thread.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from harmonyrl.config import AsyncConfig
from harmonyrl.distributed.world import World
from harmonyrl.engine.base import Engine
from harmonyrl.envs.base import EnvFactory
from harmonyrl.learn.update_result import UpdateResult
from harmonyrl.rl.partial import PartialEngine, PartialUnsupported, VersionPool, token_staleness
from harmonyrl.rollout.sampling import SampledStep
from harmonyrl.rollout.scheduler import RolloutResult
from harmonyrl.rollout.task_stream import SourceState, TaskSource
from harmonyrl.types import Task, Trajectory

StateDict = Mapping[str, torch.Tensor]


@dataclass(frozen=True)
class Drawn:
    """What collecting one step returns: its episodes, the env factory they ran in, and the task source's
    position right after the step drew its tasks."""

    sampled: SampledStep
    factory: EnvFactory
    source_state: SourceState


Collect = Callable[[int, Engine], Awaitable[Drawn]]
"""Runs step ``s``'s episodes on the given engine copy, with the weights it holds now."""


class StepDraws:
    """The run's task source as one step's batch sees it: draws go through to the source, and the source's position
    right after this batch's last draw is kept (:attr:`after`). With batches overlapping on engine copies, a later
    batch draws before this one ends, so the position when it ends would include that later draw."""

    def __init__(self, source: TaskSource) -> None:
        self.source = source
        self.after: SourceState = source.state()

    def draw(self, step: int, n: int) -> list[Task]:
        """The source's next ``n`` tasks; remembers its position after them."""
        tasks = self.source.draw(step, n)
        self.after = self.source.state()
        return tasks

    def observe(self, trajectories: Sequence[Trajectory]) -> dict[str, float]:
        """The source's own :meth:`~harmonyrl.rollout.task_stream.TaskSource.observe`."""
        return self.source.observe(trajectories)

    def state(self) -> SourceState:
        """The source's position now."""
        return self.source.state()


@runtime_checkable
class Replicable(Protocol):
    """An engine that can make a copy of itself with its own weights (the embedded engine)."""

    def replica(self) -> Engine:
        """A copy holding the same weights and version, with its own caches and worker."""
        ...


@dataclass(frozen=True)
class Collected:
    """One step's batch as the loop consumes it."""

    trajectories: tuple[Trajectory, ...]
    """The episodes to train on (dynamic sampling's uniform groups and stale ones already dropped)."""
    rollout: RolloutResult
    """Every episode the step sampled."""
    factory: EnvFactory
    """The step's env factory (its fault injector counts this batch's faults)."""
    engine_metrics: dict[str, float]
    """The engine's ``engine/*`` figures over this batch's collection."""
    batch_s: float
    """Wall time of the collection itself (in async mode it overlaps earlier steps' updates)."""
    metrics: dict[str, float]
    """``async/staleness_mean``, ``async/staleness_max``, ``async/dropped``, ``time/batch_s`` and ``sampling/*``."""
    source_state: SourceState
    """The task source's position right after this step drew its tasks."""


def staleness_metrics(
    trajectories: Sequence[Trajectory], version: int, max_staleness: int
) -> tuple[tuple[Trajectory, ...], dict[str, float]]:
    """Drop episodes sampled more than ``max_staleness`` versions before the trainer's ``version``; the kept
    ones and the ``async/*`` figures. Episodes without sampled tokens (masked faults) have no version to lag."""
    lags = [version - t.policy_version for t in trajectories if t.num_sampled > 0]
    kept = tuple(t for t in trajectories if t.num_sampled == 0 or version - t.policy_version <= max_staleness)
    metrics = {
        "async/staleness_mean": sum(lags) / len(lags) if lags else 0.0,
        "async/staleness_max": float(max(lags, default=0)),
        "async/dropped": float(len(trajectories) - len(kept)),
    }
    return kept, metrics


def check_pipeline(cfg: AsyncConfig, world: World) -> None:
    """Refuse, in one line, what the pipeline does not run: rollouts ahead of a sharded update."""
    if cfg.enabled and world.distributed:
        raise ValueError("rl.async.max_staleness > 0 runs in one process only: launch without torchrun")


def snapshot(state: StateDict) -> dict[str, torch.Tensor]:
    """A copy of ``state`` that later optimizer steps cannot change (``state_dict()`` aliases the parameters)."""
    return {name: tensor.detach().clone() for name, tensor in state.items()}


class Pipeline:
    """Where the loop gets each step's batch, runs its update and publishes its new weights (see the module
    docstring). ``collect`` is only called on the process that owns the engine."""

    def __init__(
        self,
        cfg: AsyncConfig,
        engine: Engine | None,
        collect: Collect,
        first: int,
        steps: int,
        version: int,
        snapshots: Mapping[int, StateDict],
        copies: Sequence[Engine] = (),
    ) -> None:
        """``first``: the next step to train; ``steps``: the run's last step + 1; ``version``: the version of the
        weights the trainer holds now; ``snapshots``: the versions the next batches need (async mode);
        ``copies``: further engine copies beside ``engine`` (async mode: k of them, or none)."""
        self.k = cfg.max_staleness
        self.engine = engine
        self.engines: tuple[Engine, ...] = () if engine is None else (engine, *copies)
        """Copy 0 is the run's engine (the one evaluations use); batch s runs on copy ``s mod len``."""
        self.collect = collect
        self.steps = steps
        self.version = version
        self.snapshots: dict[int, StateDict] = dict(snapshots)
        self._tasks: dict[int, asyncio.Task[Collected]] = {}
        self._next = first
        """The first step whose batch has not been started."""
        self._busy_done = 0.0
        self._busy_since: float | None = None
        self._in_flight = 0
        """Batches being collected now (several at once on engine copies)."""
        self._drawing: dict[int, asyncio.Event] = {}
        """Per started step: set once its batch has begun collecting, i.e. drawn its tasks (the first thing a
        collection does, before it awaits anything), so that batches draw in step order whatever the timing."""
        self._waited = 0.0
        self._sync_s = 0.0
        """Seconds of this step's weight sync after its update (k = 0; async batches load theirs while collecting)."""
        self._iteration = (time.perf_counter(), 0.0)
        """When the current loop iteration began, and the engine's busy seconds then."""
        self.pool: VersionPool | None = None
        """Partial rollouts: the copies by live version (:mod:`harmonyrl.rl.partial`); None otherwise."""
        if cfg.partial and self.engines:
            if len(self.engines) != self.k + 1:
                raise PartialUnsupported(
                    "rl.async.partial=true needs k + 1 copies of the embedded engine (not the vLLM client, an LLM "
                    "judge on the policy's engine, or rl.sampling.filter_uniform_groups): set rl.async.partial=false"
                )
            self.pool = VersionPool(self.engines, self.snapshots, version)
        if self.k > 0:
            self._start_ready()

    @staticmethod
    async def create(
        cfg: AsyncConfig,
        engine: Engine | None,
        collect: Collect,
        first: int,
        steps: int,
        resumed: Mapping[str, object] | None,
        weights: Callable[[], StateDict],
        copies: bool = True,
    ) -> Pipeline:
        """The pipeline at RL step ``first``: fresh (version 0, the engine's weights), or as a checkpoint's
        :meth:`state` left it (``resumed``). ``weights()``: the trainer's weights now. A resumed engine holds them
        already; it is told their version so its samples record the same versions as an uninterrupted run's.
        ``copies``: in async mode, replicate a :class:`Replicable` engine so that batches overlap (False: one
        copy, e.g. when the policy's engine also judges rewards and must hold the batch's version)."""
        version, snapshots = 0, {}
        if resumed is not None:
            version = int(resumed["version"])  # type: ignore[call-overload]
            snapshots = dict(resumed["snapshots"])  # type: ignore[call-overload]
        if engine is not None and engine.policy_version != version:
            await engine.sync_weights(weights(), version)
        replicas: list[Engine] = []
        if cfg.enabled:
            snapshots[version] = snapshot(weights())
            can: object = engine  # the Engine protocol has no replica(): ask the object itself
            if copies and isinstance(can, Replicable):
                replicas = [can.replica() for _ in range(cfg.max_staleness)]
        return Pipeline(cfg, engine, collect, first, steps, version, snapshots, replicas)

    # ------------------------------------------------------------------ what the loop calls

    async def batch(self, step: int) -> Collected:
        """Step ``step``'s batch: collected now (k = 0), or awaited from the batches running ahead."""
        t0 = time.perf_counter()
        self._iteration = (t0, self._busy(t0))
        if self.pool is not None:
            self.pool.resume()  # an evaluation may have held the copies since the last step
        if self.k == 0:
            collected = await self._run(step, None)
        else:
            collected = await self._tasks.pop(step)
        self._waited = time.perf_counter() - t0
        return collected

    async def train(
        self, update: Callable[[Sequence[Trajectory]], UpdateResult], trajectories: Sequence[Trajectory]
    ) -> UpdateResult:
        """``update(trajectories)``: in this thread (k = 0), or in a worker thread while the engine collects."""
        if self.k == 0:
            return update(trajectories)
        return await asyncio.to_thread(update, trajectories)

    async def publish(self, step: int, weights: Callable[[], StateDict], applied: bool) -> None:
        """Step ``step`` (0-based) has trained. k = 0: an applied update's ``weights()`` go to the engine as
        version ``step + 1``; k > 0: they become snapshot ``step + 1`` and the batches it enables start."""
        if self.k == 0:
            if applied and self.engine is not None:
                t0 = time.perf_counter()
                await self.engine.sync_weights(weights(), step + 1)
                self._sync_s = time.perf_counter() - t0
                self.version = step + 1
            return
        self.version = step + 1
        self.snapshots[self.version] = snapshot(weights())
        for old in [v for v in self.snapshots if v < self.version - self.k]:  # no later batch samples with it
            del self.snapshots[old]
        if self.pool is not None:
            self.pool.publish(self.version)  # the turns waiting for this version go on
        self._start_ready()

    async def drain(self) -> None:
        """Let the batches running ahead finish and load the trainer's weights into the engine (before an
        evaluation, and at the end); later batches load their own version again before they start. The other
        copies' workers stop (they start again with their next batch)."""
        if self.k == 0 or self.engine is None:
            return
        if self.pool is not None:  # batches ahead may wait for versions not trained yet: hold them instead
            await self.pool.pause()
            if self.engine.policy_version != self.version:
                await self.engine.sync_weights(self.snapshots[self.version], self.version)
            return
        for task in list(self._tasks.values()):
            await asyncio.wait([task])
        for copy_ in self.engines[1:]:
            await copy_.close()
        if self.engine.policy_version != self.version:
            await self.engine.sync_weights(self.snapshots[self.version], self.version)

    def source_state(self, batch: Collected | None, live: SourceState) -> SourceState:
        """The task source's position to checkpoint after a step: ``live`` (the source now, this step's
        observation included) when batches are not drawn ahead; in async mode the batches ahead have drawn too,
        and a resume regenerates them, so the position is the one this step's draw left."""
        return batch.source_state if self.k > 0 and batch is not None else live

    def state(self) -> dict[str, object]:
        """What a resume needs: the trainer's version and (async mode) the snapshots of the next batches."""
        return {"version": self.version, "snapshots": {v: dict(s) for v, s in self.snapshots.items()}}

    def step_metrics(self) -> dict[str, float]:
        """Idle fractions since :meth:`batch` was called: the learner's (waiting for its batch) and the engine's
        (no batch in flight); and the seconds the weight sync after the update took (0 when none ran)."""
        now = time.perf_counter()
        wall = max(now - self._iteration[0], 1e-9)
        engine_busy = min(self._busy(now) - self._iteration[1], wall)
        sync_s, self._sync_s = self._sync_s, 0.0
        return {
            "time/learner_idle_frac": self._waited / wall,
            "time/engine_idle_frac": 1.0 - engine_busy / wall,
            "time/sync_s": sync_s,
        }

    # ------------------------------------------------------------------ inside

    def _busy(self, now: float) -> float:
        """Seconds at least one batch has been in flight since the pipeline started, up to ``now``."""
        return self._busy_done + (now - self._busy_since if self._busy_since is not None else 0.0)

    def _start_ready(self) -> None:
        """Start every batch whose version exists: step s samples with version max(0, s - k)."""
        while self._next < self.steps and max(0, self._next - self.k) <= self.version:
            step, weights = self._next, self.snapshots[max(0, self._next - self.k)]
            # the batch that last used this copy (one copy: the step before) must have left it; with k + 1
            # copies that batch has been consumed already (module docstring), so this never waits. Partial
            # rollouts share the copies by version instead (rl/partial.py)
            before = None if self.pool is not None else self._tasks.get(step - max(len(self.engines), 1))
            self._drawing[step] = asyncio.Event()
            self._tasks[step] = asyncio.ensure_future(self._after(before, step, weights))
            self._next += 1

    async def _after(self, before: asyncio.Task[Collected] | None, step: int, weights: StateDict) -> Collected:
        """Batch ``step``, once the batch before it on the same engine copy has left it."""
        if before is not None:
            await asyncio.wait([before])
        return await self._run(step, weights)

    async def _run(self, step: int, weights: StateDict | None) -> Collected:
        """Load ``weights`` (version ``max(0, step - k)``) into the step's engine copy if it holds another
        version, then collect on it."""
        assert self.engines, "only the process that owns the engine collects"
        engine: Engine = self.engines[step % len(self.engines)]
        version = max(0, step - self.k)
        if self.pool is not None:
            engine = PartialEngine(self.pool, step, self.k)  # each turn on its version's copy
        elif weights is not None and engine.policy_version != version:
            await engine.sync_weights(weights, version)
        if (previous := self._drawing.pop(step - 1, None)) is not None:
            await previous.wait()  # batch step - 1 draws its tasks first
        if (mine := self._drawing.get(step)) is not None:
            mine.set()  # waiters resume only after this task's next suspension, i.e. after its draw
        window = engine.metrics_window()
        t0 = time.perf_counter()
        self._enter(t0)
        try:
            drawn = await self.collect(step, engine)
        finally:
            self._leave(time.perf_counter())
        batch_s = time.perf_counter() - t0
        engine_metrics = window(batch_s) if window is not None else {}
        trainer_version = step if self.k > 0 else self.version
        kept, metrics = staleness_metrics(drawn.sampled.trained, trainer_version, self.k)
        if isinstance(engine, PartialEngine):  # bounded per token (its async/dropped replaces the episodes')
            kept, per_token = token_staleness(drawn.sampled.trained, trainer_version, self.k)
            metrics |= per_token | {"time/partial_wait_s": engine.wait_s}
        metrics |= drawn.sampled.metrics | {"time/batch_s": batch_s}
        if self.k > 0:  # k = 0 keeps today's keys
            metrics["async/engine_copies"] = float(len(self.engines))
        rollout = drawn.sampled.rollout
        return Collected(kept, rollout, drawn.factory, engine_metrics, batch_s, metrics, drawn.source_state)

    def _enter(self, now: float) -> None:
        """A batch starts: the engine counts as busy from now while any batch is in flight."""
        if self._in_flight == 0:
            self._busy_since = now
        self._in_flight += 1

    def _leave(self, now: float) -> None:
        """A batch ends: the busy interval closes when it was the last one in flight."""
        self._in_flight -= 1
        if self._in_flight == 0 and self._busy_since is not None:
            self._busy_done += now - self._busy_since
            self._busy_since = None
