"""Fault injection: make a chosen fraction of tool calls fail, to prove that faults never poison training.

    factory = inject_faults(CalculatorFactory(), rate=0.2, kinds=("tool_timeout", "tool_crash"), seed=0)
    ...                                    # run episodes / a training step with ``factory``
    factory.injected                       # Counter({"tool_crash": 7, "tool_timeout": 5})

The wrapper sits between the rollout and any :class:`~harmonyrl.envs.base.EnvFactory`, so it works for every
environment, including a user's own. When a call is picked, the tool never runs; instead the episode gets
exactly what a real fault of that kind produces, and everything downstream (agent loop, masking, metrics)
runs its real code:

* ``tool_timeout`` / ``tool_crash`` / ``sandbox_error`` — ``StepResult(failure=Failure(kind, …))``, as an
  env returns it from its :class:`~harmonyrl.envs.tools.Toolbox` for a call that outlived its limit or a tool
  that raised :class:`~harmonyrl.envs.tools.ToolInfraError` (a tool raising anything else is the model's error
  observation, never a fault); a timeout first waits ``timeout_delay_s`` (a real one costs its tool's time limit);
* ``env_error`` — ``step()`` raises, as a broken env would; the scheduler turns that into the failure;
* ``hang`` — the tool never answers: only the episode's wall-clock budget ends it (``episode_timeout``).
  Without a budget the rollout would wait forever, so this kind requires one.

Which calls fail is deterministic under ``seed``: the decision is a hash of (seed, task id, the env's
ordinal among the envs made for that task, the call's ordinal in its episode). Envs are made in request
order, so a run injects the same faults every time; a retried episode is a new env, so it draws afresh,
which models a transient fault. Only train-split tasks are affected: held-out numbers stay comparable with
a fault-free run.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import Counter
from collections.abc import Sequence
from typing import Literal, get_args

from harmonyrl.envs.base import Env, EnvFactory
from harmonyrl.types import Failure, Message, Split, StepResult, Task, ToolSpec

InjectedKind = Literal["tool_timeout", "tool_crash", "sandbox_error", "env_error", "hang"]
INJECTED_KINDS: tuple[InjectedKind, ...] = get_args(InjectedKind)
EXPECTED_FAILURE: dict[InjectedKind, str] = {
    "tool_timeout": "tool_timeout",
    "tool_crash": "tool_crash",
    "sandbox_error": "sandbox_error",
    "env_error": "env_error",
    "hang": "episode_timeout",
}
"""The failure kind each injected kind ends its episode with."""


class InjectedFault(RuntimeError):
    """Raised by ``step()`` for an injected ``env_error``."""


def _unit(*parts: object) -> float:
    """A uniform number in [0, 1) from a stable hash (``hash()`` is salted per process)."""
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64


class FaultInjector:
    """An :class:`EnvFactory` that wraps another and makes a fraction ``rate`` of its tool calls fail."""

    def __init__(
        self,
        inner: EnvFactory,
        rate: float,
        kinds: Sequence[InjectedKind] = ("tool_timeout", "tool_crash"),
        seed: int = 0,
        timeout_delay_s: float = 0.0,
    ) -> None:
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"fault rate must be in [0, 1], got {rate}")
        if not kinds or any(k not in INJECTED_KINDS for k in kinds):
            raise ValueError(f"fault kinds must be a non-empty subset of {list(INJECTED_KINDS)}, got {list(kinds)}")
        if timeout_delay_s < 0:
            raise ValueError(f"timeout_delay_s must be >= 0, got {timeout_delay_s}")
        self.inner, self.rate, self.kinds, self.seed = inner, rate, tuple(kinds), seed
        self.timeout_delay_s = timeout_delay_s
        self.name = inner.name
        self.injected: Counter[str] = Counter()
        """Faults injected so far, by injected kind (one per faulted episode: a fault ends its episode)."""
        self.tool_calls = 0
        """Tool calls seen so far (injected or passed through)."""
        self._made: Counter[str] = Counter()

    def tasks(self, split: Split) -> Sequence[Task]:
        return self.inner.tasks(split)

    def make(self, task: Task) -> Env:
        env = self.inner.make(task)
        if task.split != "train" or self.rate == 0.0:
            return env
        ordinal = self._made[task.id]
        self._made[task.id] += 1
        return FaultyEnv(env, self, (self.seed, task.id, ordinal))

    def decide(self, key: tuple[object, ...], call: int) -> InjectedKind | None:
        """The fault for call number ``call`` of the episode ``key`` (None: let it through)."""
        self.tool_calls += 1
        if _unit(*key, call, "fault") >= self.rate:
            return None
        kind = self.kinds[int(_unit(*key, call, "kind") * len(self.kinds))]
        self.injected[kind] += 1
        return kind


class FaultyEnv:
    """One episode's env with injected tool faults; everything else is passed through unchanged."""

    def __init__(self, inner: Env, injector: FaultInjector, key: tuple[object, ...]) -> None:
        self.inner, self._injector, self._key = inner, injector, key
        self._calls = 0

    @property
    def tools(self) -> Sequence[ToolSpec]:
        return self.inner.tools

    @property
    def instructions(self) -> str:
        return self.inner.instructions

    async def reset(self) -> list[Message]:
        self._calls = 0
        return await self.inner.reset()

    async def step(self, action: Sequence[Message]) -> StepResult:
        last = action[-1] if action else None
        if last is None or not last.is_tool_call:
            return await self.inner.step(action)
        kind = self._injector.decide(self._key, self._calls)
        self._calls += 1
        name = last.tool_name
        match kind:
            case None:
                return await self.inner.step(action)
            case "env_error":
                raise InjectedFault(f"injected env error in tool call {name!r}")
            case "hang":
                await asyncio.Event().wait()  # until the episode's budget cancels it
                raise AssertionError("unreachable")
            case "tool_timeout":
                await asyncio.sleep(self._injector.timeout_delay_s)
        return StepResult(failure=Failure(kind, f"injected {kind} in tool call {name!r}"))

    async def close(self) -> None:
        await self.inner.close()


def inject_faults(
    factory: EnvFactory,
    rate: float,
    kinds: Sequence[InjectedKind] = ("tool_timeout", "tool_crash"),
    seed: int = 0,
    timeout_delay_s: float = 0.0,
) -> FaultInjector:
    """``factory`` with a fraction ``rate`` of its tool calls failing as ``kinds`` (see the module docstring)."""
    return FaultInjector(factory, rate, kinds, seed, timeout_delay_s)


def injected_metrics(factory: EnvFactory) -> dict[str, float]:
    """``env/injected_<kind>`` counts of a :class:`FaultInjector` (every configured kind, zeros included);
    nothing for any other factory."""
    if not isinstance(factory, FaultInjector):
        return {}
    return {f"env/injected_{kind}": float(factory.injected[kind]) for kind in factory.kinds}
