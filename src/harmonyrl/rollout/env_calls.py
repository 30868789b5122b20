"""The boundary between the environment's code and the harness: which exceptions are environment faults.

Only the environment's own calls — ``factory.make``, ``env.reset`` (with the tools and instructions it
declares), ``env.step`` (which runs the tools) and ``env.close`` — may produce an environment fault. Each of
those calls, and nothing else, goes through :func:`env_call` / :func:`env_call_sync`, which turn any
exception the call raises into an :class:`EnvFault` carrying a typed ``env_error`` :class:`Failure`. The
scheduler masks an episode only on an ``EnvFault``; every other exception (the engine's, the harmony
parser's, a renderer's, a bug in the agent loop) propagates and fails the step loudly (invariant 8).

The classification is structural — *where* the exception was raised, not *what type* it is: a
``ValueError`` from ``env.step`` is an environment fault, the same ``ValueError`` from the parser is not.
Cancellation (``BaseException``) is never wrapped, so the episode's wall-clock budget still ends a hung call.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Literal, ParamSpec, TypeVar

from harmonyrl.types import Failure

EnvCallName = Literal["make", "reset", "step", "close", "tools"]
P = ParamSpec("P")
R = TypeVar("R")
DETAIL_CHARS = 500
"""How much of the exception's text a failure keeps (the record of one episode, not a log)."""


class EnvFault(Exception):
    """An exception raised inside one of the environment's own calls; ``failure`` is what the episode records."""

    def __init__(self, call: EnvCallName, cause: Exception) -> None:
        self.call = call
        self.failure = Failure("env_error", f"{call}: {type(cause).__name__}: {cause}"[:DETAIL_CHARS])
        super().__init__(f"the environment's {call} raised {type(cause).__name__}: {cause}")


async def env_call(call: EnvCallName, fn: Callable[P, Awaitable[R]], *args: P.args, **kwargs: P.kwargs) -> R:
    """Await ``fn(*args, **kwargs)``, an environment coroutine; any exception it raises becomes an
    :class:`EnvFault` (also one raised when calling ``fn``, before there is anything to await)."""
    try:
        return await fn(*args, **kwargs)
    except Exception as e:
        raise EnvFault(call, e) from e


def env_call_sync(call: EnvCallName, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """:func:`env_call` for the environment's synchronous calls (``factory.make``, reading ``env.tools``)."""
    try:
        return fn(*args, **kwargs)
    except Exception as e:
        raise EnvFault(call, e) from e
