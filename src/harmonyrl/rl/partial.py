"""Partial rollouts (``rl.async.partial``, docs/async.md): an episode in flight while the trainer publishes a newer
policy version continues under it, and every token records the version that sampled it.

**When an episode takes a newer version.** Batch s starts with version ``b = max(0, s - k)`` and is trained at
step s, when the trainer holds version s; versions b + 1 … s are published while it runs. Turn j of each of its
episodes samples with version ``min(s, b + j)``: the i-th update the batch lives through is taken at turn i. The
turn, not the moment the update lands: a version picked by the clock would make the tokens depend on timing, and a
resumed run regenerates the batches in flight (docs/async.md, item 7), which must then sample what the
uninterrupted run sampled. The price is pacing: a turn whose version is not published yet waits for it
(``time/partial_wait_s``), typically while the episode's tool call is still running anyway. Each turn recomputes
its context's keys and values under its own version (the engine copy that holds it prefills the prompt), so no
token is conditioned on another version's cache.

**Which copy.** The live versions are always the k + 1 latest: a request for version v can only come once v is
published, i.e. once the trainer has consumed batch v − 1, and the batches still running start at version
``v − k`` or later. So version v lives on engine copy ``v mod (k + 1)``, which last held ``v − k − 1``, a
version no running batch asks for: it is loaded there (from the pipeline's snapshots) on the first request.

**Per-token staleness.** By the schedule no token of batch s is older than ``s − k``; :func:`token_staleness`
still checks every sampled token against the trainer's version, masks any older than k versions out of the loss
(``async/stale_tokens``) and drops an episode left with no token to train on (``async/dropped``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Mapping, Sequence

import torch

from harmonyrl.engine.base import Engine, MetricsWindow
from harmonyrl.engine.turn import EPISODE_TURN
from harmonyrl.errors import UserError
from harmonyrl.types import Generation, SamplingParams, Trajectory


class PartialUnsupported(UserError, ValueError):
    """Partial rollouts asked for where the pipeline cannot hold k + 1 engine copies (one line, no traceback)."""


def turn_version(step: int, k: int, turn: int) -> int:
    """The policy version that samples turn ``turn`` (0-based) of batch ``step``'s episodes: ``min(s, b + turn)``
    with ``b = max(0, s - k)`` (the module docstring). Example: k = 2, step 5: turns 0, 1, 2, 3 → 3, 4, 5, 5."""
    return min(step, max(0, step - k) + turn)


class VersionPool:
    """The engine copies, one per live version (``v mod (k + 1)``), loaded on demand from the pipeline's snapshots
    once the version is published; and the pause that lets an evaluation have copy 0 to itself."""

    def __init__(self, engines: Sequence[Engine], snapshots: Mapping[int, Mapping[str, torch.Tensor]], version: int):
        self.engines = tuple(engines)
        self.snapshots = snapshots
        """The pipeline's own dict: the versions the running batches need (at most k + 1)."""
        self.version = version
        self._published = asyncio.Event()
        """Set (and replaced) at every publication: requests for a later version wait on it."""
        self._locks = [asyncio.Lock() for _ in self.engines]
        self._running = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._open = asyncio.Event()
        self._open.set()

    def publish(self, version: int) -> None:
        """The trainer holds ``version`` now (its snapshot is in :attr:`snapshots`): the requests waiting for it go."""
        self.version = version
        self._published.set()
        self._published = asyncio.Event()

    async def generate(
        self, version: int, prompt_ids: Sequence[int], params: SamplingParams
    ) -> tuple[Generation, float]:
        """Sample on the copy holding ``version``, once it is published (and no evaluation holds the copies); and
        the seconds the request waited for that."""
        t0 = time.perf_counter()
        while version > self.version:
            await self._published.wait()
        await self._open.wait()
        waited = time.perf_counter() - t0
        self._running += 1  # counted before any await, so that a pause waits for this request too
        self._idle.clear()
        index = version % len(self.engines)
        engine = self.engines[index]
        try:
            async with self._locks[index]:
                if engine.policy_version != version:  # what runs on this copy is of this version, or nothing
                    await engine.sync_weights(self.snapshots[version], version)
            return await engine.generate(prompt_ids, params), waited
        finally:
            self._running -= 1
            if self._running == 0:
                self._idle.set()

    async def pause(self) -> None:
        """Hold new requests and wait until no generation runs on any copy (tool calls keep running)."""
        self._open.clear()
        await self._idle.wait()

    def resume(self) -> None:
        """Let the held requests go (each copy reloads its live version on its next request)."""
        self._open.set()


class PartialEngine:
    """Batch ``step``'s view of the pool (an :class:`~harmonyrl.engine.base.Engine`): each ``generate`` samples
    with :func:`turn_version` of the turn the agent loop is on (:data:`~harmonyrl.engine.turn.EPISODE_TURN`)."""

    def __init__(self, pool: VersionPool, step: int, k: int) -> None:
        self.pool = pool
        self.step = step
        self.k = k
        self.policy_version = max(0, step - k)
        """The batch's first version (its turns 0)."""
        self.wait_s = 0.0
        """Seconds this batch's requests waited for their version to be published (summed over requests)."""

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        """The turn's version's sample (``Generation.policy_version`` says which)."""
        version = turn_version(self.step, self.k, EPISODE_TURN.get())
        generation, waited = await self.pool.generate(version, prompt_ids, params)
        self.wait_s += waited
        return generation

    async def sync_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Never called: the pool loads each copy's version itself."""
        raise RuntimeError("a partial rollout's engine takes its versions from the pipeline, not sync_weights")

    def metrics_window(self) -> MetricsWindow | None:
        """None: the copies are shared by the batches in flight, so no copy's figures are this batch's alone."""
        return None

    async def close(self) -> None:
        """Nothing of its own to stop (the pipeline owns the copies)."""


def token_staleness(
    trajectories: Sequence[Trajectory], version: int, max_staleness: int
) -> tuple[tuple[Trajectory, ...], dict[str, float]]:
    """Staleness per sampled token against the trainer's ``version``: tokens more than ``max_staleness`` versions
    old are masked out of the loss (``async/stale_tokens``), an episode left with none is dropped
    (``async/dropped``); ``async/token_staleness_mean`` over the sampled tokens, ``async/spanning`` the episodes
    sampled by more than one version. (The episode figures, by each episode's oldest version, are
    :func:`~harmonyrl.rl.pipeline.staleness_metrics`'.)"""
    kept: list[Trajectory] = []
    lags: list[int] = []
    stale = spanning = dropped = 0
    for traj in trajectories:
        versions = traj.versions()
        sampled = [v for v in versions if v >= 0]
        if not sampled:  # a masked fault: no token to lag
            kept.append(traj)
            continue
        spanning += len(set(sampled)) > 1
        lags.extend(version - v for v in sampled)
        old = [v >= 0 and version - v > max_staleness for v in versions]
        if not any(old):
            kept.append(traj)
            continue
        stale += sum(old)
        mask = tuple(0 if o else m for m, o in zip(traj.loss_mask, old, strict=True))
        if any(mask):
            kept.append(dataclasses.replace(traj, loss_mask=mask))
        else:
            dropped += 1
    metrics = {
        "async/token_staleness_mean": sum(lags) / len(lags) if lags else 0.0,
        "async/stale_tokens": float(stale),
        "async/spanning": float(spanning),
        "async/dropped": float(dropped),
    }
    return tuple(kept), metrics
