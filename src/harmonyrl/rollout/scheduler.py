"""Runs many episodes concurrently against one engine, each under a wall-clock budget, retrying faulted groups.

Every episode is its own asyncio task, so while one waits for a tool the engine keeps decoding the others
(continuous batching does the rest).

**Whose fault** (invariant 8). An exception raised by one of the environment's own calls (make, reset, step,
close; tools run inside step) arrives as an :class:`~harmonyrl.rollout.env_calls.EnvFault` and becomes a typed
``env_error`` failure for that episode only: one failing environment never aborts a step. Any other exception
— the engine's, the parser's, a bug in the harness — is not the environment's: it propagates out of
:func:`run_episodes` with its traceback (annotated with the episode's task and seed), the episodes still
running are cancelled (their environments closed), and the step fails loudly instead of being masked.

**Wall-clock budget** (``EpisodeLimits.timeout_s``). The clock starts when the episode gets its concurrency
slot (time queued behind other episodes is not its own) and covers env creation, every generation and every
tool call. On expiry the episode's task is cancelled, and the cancellation travels down the awaits it is
blocked in: an async tool's coroutine is cancelled, a sandboxed program's process group (and, under
bubblewrap, its whole pid namespace) is SIGKILLed and reaped before the cancellation completes
(:mod:`harmonyrl.sandbox.run`). A *sync* tool runs in a worker thread, which Python cannot kill: its result
is discarded, the thread runs to its end in the background (holding one of the tool pool's threads; one that
never ends also holds up interpreter exit, which joins pool threads), and the episode does not wait for it.
An env that blocks the event loop itself (a sync call inside ``async def step``) cannot be interrupted by
anything in-process; the Env contract forbids it.

The expiry is an ``episode_timeout`` *environment* fault — masked, counted, never scored 0 — because wall
clock is not something the policy controls reproducibly: it depends on machine load, on the other episodes
sharing the engine and on tool latency. Everything the model does control is already bounded
deterministically and charged to it (tokens and turns truncate; a program's own infinite loop is a
sandbox ``timeout`` observation). Set the budget above ``max_turns`` × (generation + tool time) so it only
fires when something hangs.

**Group retry** (``retry_faulted_groups``). Group-relative advantages compare the episodes of one task, so a
group that lost episodes to faults is a smaller, noisier comparison. Up to N times, the faulted episodes of
such groups are run again with their original seeds; the group's healthy episodes are kept, since with the
same weights and seeds re-running them would reproduce them token for token. Re-using the seed means a retry
reproduces the very episode the fault interrupted — retries recover transient faults without selecting for
behaviour that happens to avoid a fault. Episodes still faulted after the last retry stay masked.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass

from harmonyrl.engine.base import Engine
from harmonyrl.envs.base import EnvFactory
from harmonyrl.harmony.tokenizer import Codec
from harmonyrl.rollout.agent_loop import EpisodeLimits, run_episode
from harmonyrl.rollout.env_calls import EnvFault, env_call, env_call_sync
from harmonyrl.types import Failure, SamplingParams, Task, Trajectory, Turn

CLOSE_TIMEOUT_S = 5.0
"""How long ``env.close()`` may take; an env that hung its episode may hang its close too."""


@dataclass(frozen=True)
class EpisodeRequest:
    task: Task
    group_id: int
    seed: int


@dataclass(frozen=True)
class RolloutResult:
    trajectories: tuple[Trajectory, ...]
    wall_s: float
    group_retries: int = 0
    """Faulted groups run again, summed over retry rounds."""
    retried_episodes: int = 0
    """Faulted episodes run again, summed over retry rounds."""

    def fault_metrics(self) -> dict[str, float]:
        """Retry counters and the groups that still hold a masked episode after every retry."""
        faulted = {t.group_id for t in self.trajectories if t.failure is not None}
        return {
            "rollout/group_retries": float(self.group_retries),
            "rollout/retried_episodes": float(self.retried_episodes),
            "rollout/faulted_groups": float(len(faulted)),
        }


def _failed(req: EpisodeRequest, failure: Failure, turns: Sequence[Turn] = ()) -> Trajectory:
    """A masked episode: no tokens to train on, but the turns it got through are kept for the record."""
    return Trajectory(
        task_id=req.task.id,
        group_id=req.group_id,
        token_ids=(),
        loss_mask=(),
        sampler_logprobs=(),
        reward=0.0,
        terminated=False,
        truncated=False,
        failure=failure,
        turns=tuple(turns),
    )


async def _episode(
    engine: Engine,
    factory: EnvFactory,
    codec: Codec,
    params: SamplingParams,
    limits: EpisodeLimits,
    req: EpisodeRequest,
    transcript: list[Turn],
) -> Trajectory:
    """One episode; an environment's exception (an ``EnvFault``) becomes an ``env_error`` here, anything else
    propagates with a note naming the episode. ``transcript`` receives the turns as they happen."""
    env = None
    try:
        env = env_call_sync("make", factory.make, req.task)
        return await run_episode(
            engine,
            env,
            codec,
            params,
            limits,
            task_id=req.task.id,
            group_id=req.group_id,
            seed=req.seed,
            transcript=transcript,
        )
    except EnvFault as fault:  # the env's own call failed: mask this episode, keep the step
        return _failed(req, fault.failure, transcript)
    except Exception as exc:  # the harness's: fail the step, saying which episode it was
        exc.add_note(f"in the episode of task '{req.task.id}' (group {req.group_id}, seed {req.seed})")
        raise
    finally:
        if env is not None:
            # a failing (or hanging) close must not turn a finished episode into a lost one
            with contextlib.suppress(EnvFault, TimeoutError):
                await asyncio.wait_for(env_call("close", env.close), CLOSE_TIMEOUT_S)


async def _one(
    engine: Engine,
    factory: EnvFactory,
    codec: Codec,
    params: SamplingParams,
    limits: EpisodeLimits,
    req: EpisodeRequest,
    gate: asyncio.Semaphore,
) -> Trajectory:
    transcript: list[Turn] = []
    async with gate:
        budget = asyncio.timeout(limits.timeout_s)
        try:
            async with budget:
                return with_task(await _episode(engine, factory, codec, params, limits, req, transcript), req.task)
        except TimeoutError:
            if not budget.expired():  # a TimeoutError the harness raised, not the budget's: not masked
                raise
            # the budget has cancelled the episode (and with it any running tool) by now
            failure = Failure("episode_timeout", f"exceeded its {limits.timeout_s:g} s wall-clock budget")
            return with_task(_failed(req, failure, transcript), req.task)


def with_task(traj: Trajectory, task: Task) -> Trajectory:
    """``traj`` carrying its task's prompt and expected answer, for the people who read the record."""
    return dataclasses.replace(traj, task_prompt=task.prompt, expected_answer=task.answer)


async def run_episodes(
    engine: Engine,
    factory: EnvFactory,
    codec: Codec,
    requests: Sequence[EpisodeRequest],
    params: SamplingParams,
    limits: EpisodeLimits,
    max_concurrency: int,
    retry_faulted_groups: int = 0,
) -> RolloutResult:
    """Run all ``requests`` with at most ``max_concurrency`` episodes in flight; results keep request order.

    With ``retry_faulted_groups`` = N, the faulted episodes of groups that have any are run again, up to N
    rounds (see the module docstring)."""
    gate = asyncio.Semaphore(max_concurrency)
    t0 = time.perf_counter()

    async def batch(reqs: Sequence[EpisodeRequest]) -> list[Trajectory]:
        tasks = [asyncio.ensure_future(_one(engine, factory, codec, params, limits, r, gate)) for r in reqs]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:  # a harness failure (or our own cancellation): stop the siblings, then raise it
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    trajs = await batch(requests)
    group_retries = retried_episodes = 0
    for _ in range(retry_faulted_groups):
        redo = [i for i, t in enumerate(trajs) if t.failure is not None]
        if not redo:
            break
        group_retries += len({trajs[i].group_id for i in redo})
        retried_episodes += len(redo)
        for i, t in zip(redo, await batch([requests[i] for i in redo]), strict=True):
            trajs[i] = t
    return RolloutResult(tuple(trajs), time.perf_counter() - t0, group_retries, retried_episodes)


def group_requests(tasks: Sequence[Task], group_size: int, base_seed: int) -> list[EpisodeRequest]:
    """``group_size`` episodes per task; seeds derive from the position so runs are reproducible."""
    return [
        EpisodeRequest(task, g, base_seed * 1_000_003 + g * group_size + i)
        for g, task in enumerate(tasks)
        for i in range(group_size)
    ]
