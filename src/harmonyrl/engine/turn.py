"""Which turn of its episode a ``generate`` call samples, for an engine whose weights depend on it.

The :class:`~harmonyrl.engine.base.Engine` protocol's ``generate`` sees a prompt and sampling parameters, not the
episode around them. Partial rollouts (``rl.async.partial``, docs/async.md) pick the policy version of a call by its
turn, so the agent loop says which turn it is here before each call. A context variable, not an argument: every
episode runs in its own asyncio task, whose context is its own, so concurrent episodes never see each other's turn,
and the engines and the agent loops that do not care need no new parameter.
"""

from __future__ import annotations

from contextvars import ContextVar

EPISODE_TURN: ContextVar[int] = ContextVar("harmonyrl_episode_turn", default=0)
"""The 0-based turn of the episode whose generation is being requested in this task (0 outside an agent loop)."""
