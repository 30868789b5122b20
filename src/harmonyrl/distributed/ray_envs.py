"""Environments that live in Ray actors, seen from the driver through the ordinary Env protocol.

    factory = RayEnvFactory(pool, local)   # built by harmonyrl.distributed.ray_cluster.start_env_pool
    env = factory.make(task)               # picks a worker; nothing is sent yet
    first = await env.reset()              # the worker makes the env, resets it, returns messages + declarations
    result = await env.step(action)        # the worker runs the step (its tools, their timeouts, sandboxes)
    await env.close()

The agent loop and the scheduler are unchanged: they await ``reset``/``step``/``close`` as with any env, and
the engine stays in the driver. The driver's own factory (``local``) is used only for what is not an episode:
the task lists and the env's name.

**Assignment: least loaded.** ``make`` gives the episode to the live worker holding the fewest open episodes
(made, not yet closed; ties to the lowest index), so a worker slowed by long tool calls gets fewer new ones than
round-robin would give it. The choice does not change any result: an episode's env is built from its task alone.

**A dying worker is the environment's fault** (invariant 8). A worker process that crashes, is killed or whose
node is lost makes the calls of its episodes in flight raise Ray's ``RayActorError``; that happens inside the
env's own ``reset``/``step``, so the scheduler records an ``env_error`` failure and masks the episode, and the
step goes on. Ray restarts the worker (``scale.max_restarts``): until a probe finds it back, new episodes go to the
other workers (a call sent during a restart fails); an episode whose env died with it fails on its next call
(:class:`~harmonyrl.distributed.ray_worker.UnknownEpisode`).
A worker that is gone for good gets no new episodes; with none left, ``make`` raises, which is again an
environment fault, and the fault breaker stops the run with a one-line reason. ``env/worker_faults`` counts the
episodes that lost a call this way.

**Cancellation** (the episode's wall-clock budget) cancels the worker's task too (``ray.cancel``), so the tool
or sandboxed program stops there as it would in-process, and the worker is free for its next call.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Literal, cast

from harmonyrl.distributed.ray_worker import EnvWorker, Opening, ends_episode
from harmonyrl.envs.base import EnvFactory
from harmonyrl.types import Message, Split, StepResult, Task, ToolSpec

if TYPE_CHECKING:
    from ray import ObjectRef
    from ray.actor import ActorHandle

    Worker = ActorHandle[EnvWorker]
    """A handle on one env worker actor."""


class NoLiveWorkers(RuntimeError):
    """Every env worker of the pool is gone for good (raised by ``make``: an environment fault)."""


class EnvPool:
    """The driver's side of the env workers: their handles, their load, and the faults their deaths caused."""

    def __init__(self, workers: Sequence[Worker], release: Callable[[], None] | None = None) -> None:
        self.workers = list(workers)
        self._release = release
        """Called once by :meth:`close`: stops the workers, frees their placement group (and a local cluster)."""
        self.open = [0] * len(self.workers)
        self.dead: set[int] = set()
        """Workers gone for good (Ray's restarts exhausted)."""
        self.down: dict[int, ObjectRef[int]] = {}
        """Workers that lost a call and may be restarting, each with its pending ``ready`` probe."""
        self.faulted: set[int] = set()
        """Episodes that lost a call to a dying worker, since :meth:`take_metrics` last read them."""

    def assign(self) -> int:
        """The live worker with the fewest open episodes (lowest index on ties); it now holds one more. Workers
        still restarting are chosen only when no other is left (calls sent during a restart fail)."""
        self._recheck()
        live = [i for i in range(len(self.workers)) if i not in self.dead]
        if not live:
            raise NoLiveWorkers(f"all {len(self.workers)} env workers are dead (scale.max_restarts exhausted)")
        worker = min(live, key=lambda i: (i in self.down, self.open[i], i))
        self.open[worker] += 1
        return worker

    def _recheck(self) -> None:
        """Workers whose probe answered take episodes again; a probe that says the worker is gone marks it dead;
        one that says it is still restarting is sent again. Never waits."""
        if not self.down:
            return
        import ray
        from ray.exceptions import ActorDiedError, RayActorError

        for worker, probe in list(self.down.items()):
            if not ray.wait([probe], timeout=0)[0]:
                continue
            try:
                ray.get(probe)
                del self.down[worker]
            except ActorDiedError:
                del self.down[worker]
                self.dead.add(worker)
            except RayActorError:
                self.down[worker] = self.workers[worker].ready.remote()

    def release(self, worker: int) -> None:
        """One of ``worker``'s episodes is closed."""
        self.open[worker] = max(0, self.open[worker] - 1)

    async def call(self, worker: int, method: Literal["reset", "step", "close"], episode: int, *args: object) -> object:
        """``workers[worker].method(episode, *args)``, awaited; a cancellation cancels the worker's task too. An
        exception the env raised in the worker is raised here as itself (not Ray's wrapper, whose text is the
        remote traceback), so its failure record reads as it would in-process."""
        from ray.exceptions import ActorDiedError, RayActorError, RayTaskError

        ref = getattr(self.workers[worker], method).remote(episode, *args)
        try:
            return cast(object, await ref)
        except asyncio.CancelledError:
            import ray

            ray.cancel(ref)  # stop the tool/sandbox in the worker, as an in-process cancellation would
            raise
        except RayTaskError as e:
            if isinstance(e.cause, Exception):
                raise e.cause from e
            raise
        except RayActorError as e:
            self.faulted.add(episode)
            if isinstance(e, ActorDiedError):  # restarts exhausted (an unavailable one is still restarting)
                self.dead.add(worker)
            elif worker not in self.down:
                self.down[worker] = self.workers[worker].ready.remote()
            raise

    def take_metrics(self) -> dict[str, float]:
        """``env/worker_faults`` (episodes that lost a call to a dying worker since the last read) and
        ``env/workers_alive``."""
        alive = len(self.workers) - len(self.dead)
        metrics = {"env/worker_faults": float(len(self.faulted)), "env/workers_alive": float(alive)}
        self.faulted = set()
        return metrics

    def close(self) -> None:
        """Stop the workers and release what the pool holds on the cluster (idempotent)."""
        release, self._release = self._release, None
        if release is not None:
            release()


class RayEnv:
    """One episode's env, living in an env worker; ``tools`` and ``instructions`` are known once reset."""

    def __init__(self, pool: EnvPool, task: Task, episode: int) -> None:
        self._pool, self._task, self._episode = pool, task, episode
        self._worker: int | None = pool.assign()
        self._opening: Opening | None = None
        self._closed_there = False

    @property
    def worker(self) -> int | None:
        """The worker holding this episode (None once closed)."""
        return self._worker

    def _held(self) -> int:
        if self._worker is None:
            raise RuntimeError(f"episode {self._episode} is closed")
        return self._worker

    def _opened(self) -> Opening:
        if self._opening is None:
            raise RuntimeError("a Ray env declares its tools and instructions in reset(): reset it first")
        return self._opening

    @property
    def tools(self) -> Sequence[ToolSpec]:
        return self._opened().tools

    @property
    def instructions(self) -> str:
        return self._opened().instructions

    async def reset(self) -> list[Message]:
        opening = await self._pool.call(self._held(), "reset", self._episode, self._task)
        self._opening = cast(Opening, opening)
        return list(self._opening.messages)

    async def step(self, action: Sequence[Message]) -> StepResult:
        result = cast(StepResult, await self._pool.call(self._held(), "step", self._episode, list(action)))
        self._closed_there = ends_episode(result)  # the worker closed the env itself (see EnvWorker.step)
        return result

    async def close(self) -> None:
        if self._worker is None:
            return
        worker, self._worker = self._worker, None
        self._pool.release(worker)  # first: a close that fails or hangs still frees the slot
        if not self._closed_there:
            await self._pool.call(worker, "close", self._episode)


class RayEnvFactory:
    """An :class:`~harmonyrl.envs.base.EnvFactory` whose envs live in the pool's workers; ``local`` (the same
    env, built in the driver) answers ``name`` and ``tasks``."""

    def __init__(self, pool: EnvPool, local: EnvFactory) -> None:
        self.pool, self.local = pool, local
        self.name = local.name
        self._episodes = itertools.count()

    def tasks(self, split: Split) -> Sequence[Task]:
        return self.local.tasks(split)

    def make(self, task: Task) -> RayEnv:
        return RayEnv(self.pool, task, next(self._episodes))


def env_pool_metrics(factory: EnvFactory) -> dict[str, float]:
    """The pool's ``env/worker_faults`` and ``env/workers_alive`` for a :class:`RayEnvFactory`; nothing otherwise."""
    return factory.pool.take_metrics() if isinstance(factory, RayEnvFactory) else {}


def close_env_pool(factory: EnvFactory) -> None:
    """Stop a :class:`RayEnvFactory`'s workers (and the local cluster it started); nothing for any other factory."""
    if isinstance(factory, RayEnvFactory):
        factory.pool.close()
