"""One env worker: the environments of the episodes assigned to it, as a plain class Ray turns into an actor.

The worker builds its own :class:`~harmonyrl.envs.base.EnvFactory` from a :data:`FactoryRecipe` — a function and
its (picklable) config, such as ``functools.partial(make_factory, env_config, seed)`` — so what crosses the wire
is the config, never a factory object with its tool pools, sandboxes or open databases. Each episode's env is
made, used and closed here; the driver sees only the values the :class:`~harmonyrl.envs.base.Env` protocol
returns (messages, tool declarations, step results), which are frozen dataclasses.

Nothing here imports Ray: :mod:`harmonyrl.distributed.ray_cluster` wraps the class with ``ray.remote`` when it
starts the pool, so the class can be tested (and the env code in it debugged) in one process.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from harmonyrl.envs.base import Env, EnvFactory
from harmonyrl.rollout.scheduler import CLOSE_TIMEOUT_S
from harmonyrl.types import Message, StepResult, Task, ToolSpec

FactoryRecipe = Callable[[], EnvFactory]
"""How a worker builds its factory: called once, inside the worker."""


@dataclass(frozen=True)
class Opening:
    """What ``reset`` hands back to the driver: the env's first messages and what it declares for the prompt."""

    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...]
    instructions: str


class UnknownEpisode(LookupError):
    """A step for an episode this worker holds no env for (it was never reset here, or the worker restarted)."""


class EnvWorker:
    """The envs of the episodes assigned to one worker, keyed by the driver's episode number."""

    def __init__(self, recipe: FactoryRecipe) -> None:
        self.factory = recipe()
        self.envs: dict[int, Env] = {}

    def ready(self) -> int:
        """The worker's process id, once its factory is built (the pool waits on this before any episode)."""
        return os.getpid()

    async def reset(self, episode: int, task: Task) -> Opening:
        """Make the episode's env, reset it and read what it declares (all three are the env's own calls)."""
        env = self.factory.make(task)
        self.envs[episode] = env
        first = await env.reset()
        return Opening(tuple(first), tuple(env.tools), env.instructions)

    async def step(self, episode: int, action: Sequence[Message]) -> StepResult:
        """One step of the episode's env (the tools run here, under the env's own timeouts and sandboxes). A step
        that ends the episode also closes its env here, saving the driver a round trip (:meth:`close`)."""
        env = self.envs.get(episode)
        if env is None:
            raise UnknownEpisode(f"env worker {os.getpid()} holds no env for episode {episode} (did it restart?)")
        result = await env.step(action)
        if ends_episode(result):
            del self.envs[episode]
            await close_quietly(env)
        return result

    async def close(self, episode: int) -> None:
        """Close and forget the episode's env; an episode that never got one has nothing to close."""
        env = self.envs.pop(episode, None)
        if env is not None:
            await env.close()

    def open_episodes(self) -> int:
        """Envs made here and not closed yet."""
        return len(self.envs)


def ends_episode(result: StepResult) -> bool:
    """Whether the agent loop stops after this step whatever it sampled (the env's own end, or its failure)."""
    return result.terminated or result.truncated or result.failure is not None


async def close_quietly(env: Env) -> None:
    """``env.close()`` as the scheduler runs it after an episode: bounded, and a failing close does not turn a
    finished episode into a lost one (:data:`~harmonyrl.rollout.scheduler.CLOSE_TIMEOUT_S`)."""
    with contextlib.suppress(Exception):
        await asyncio.wait_for(env.close(), CLOSE_TIMEOUT_S)
