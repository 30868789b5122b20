"""A notes tool any environment can add: ``remember(key, note)`` / ``recall(key)``, private to one episode.

    factory = with_memory(SqlFactory(seed=0))        # or ``env.memory=true`` in the config
    env = factory.make(task)                         # the sql tools plus remember / recall

It is a wrapper, not a feature of each env, so every env (built-in or a user's) gets it unchanged:
:class:`MemoryEnv` declares the inner env's tools plus the two memory tools, answers calls to those itself
and passes every other action to the inner env untouched. The inner env never sees a memory call, so its
reward terms and turn counts are its own (a memory turn is not charged by its ``step_cost``; it still counts
against ``rollout.max_turns``). The terminal ``info`` gains ``memory_calls``.

Caps keep a notes store from becoming a way to flood the context: at most :data:`MAX_NOTES` notes of
:data:`MAX_NOTE_CHARS` characters under keys of :data:`MAX_KEY_CHARS`. Going over a cap, or recalling a key
never stored, is the model's mistake: an ``{"error": ...}`` observation listing the stored keys, never a
failure. Writing an existing key replaces its note. The store starts empty at every ``reset``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

from harmonyrl.envs.base import Env, EnvFactory
from harmonyrl.envs.tools import Tool, Toolbox, error_text
from harmonyrl.types import Message, Split, StepResult, Task, ToolSpec

MAX_NOTES = 16
MAX_NOTE_CHARS = 300
MAX_KEY_CHARS = 40
NOTE = "You can keep notes for later turns: remember(key, note) stores a note, recall(key) reads it back."


def remember(key: str, note: str) -> str:
    """Store a short note under a key (replacing any note already there), to read back later with recall.

    Args:
        key: A short name for the note, e.g. "plan".
        note: The text to keep.
    """
    raise NotImplementedError("bound to an episode by MemoryEnv")


def recall(key: str) -> str:
    """Read back the note stored under a key; an empty key lists the stored keys.

    Args:
        key: The name the note was stored under.
    """
    raise NotImplementedError("bound to an episode by MemoryEnv")


REMEMBER, RECALL = Tool.from_function(remember, timeout_s=2.0), Tool.from_function(recall, timeout_s=2.0)
MEMORY_TOOLS = frozenset({REMEMBER.name, RECALL.name})


class Notes:
    """The per-episode store and its caps (plain functions of the store, tested directly)."""

    def __init__(self) -> None:
        self.notes: dict[str, str] = {}

    def remember(self, key: str, note: str) -> str:
        if not key.strip() or len(key) > MAX_KEY_CHARS:
            return error_text(f"key must be 1 to {MAX_KEY_CHARS} characters")
        if len(note) > MAX_NOTE_CHARS:
            return error_text(f"note is {len(note)} characters; the limit is {MAX_NOTE_CHARS}")
        if key not in self.notes and len(self.notes) >= MAX_NOTES:
            return error_text(f"already {MAX_NOTES} notes (the limit); reuse a key: {sorted(self.notes)}")
        self.notes[key] = note
        return json.dumps({"stored": key, "notes": len(self.notes)})

    def recall(self, key: str) -> str:
        if not key:
            return json.dumps({"keys": sorted(self.notes)})
        if key not in self.notes:
            return error_text(f"no note under {key!r}; stored keys: {sorted(self.notes)}")
        return json.dumps({"key": key, "note": self.notes[key]})


class MemoryEnv:
    """``inner`` plus the memory tools; every non-memory action goes to ``inner`` unchanged."""

    def __init__(self, inner: Env) -> None:
        if clash := MEMORY_TOOLS & {t.name for t in inner.tools}:
            raise ValueError(f"the environment already has tool(s) {sorted(clash)}; cannot add memory")
        self.inner = inner
        self._new_episode()

    def _new_episode(self) -> None:
        self.notes, self._calls = Notes(), 0
        notes = self.notes

        async def remember_here(key: str, note: str) -> str:
            return notes.remember(key, note)

        async def recall_here(key: str) -> str:
            return notes.recall(key)

        self._toolbox = Toolbox([dataclasses.replace(REMEMBER, fn=remember_here),
                                 dataclasses.replace(RECALL, fn=recall_here)])  # fmt: skip

    @property
    def tools(self) -> Sequence[ToolSpec]:
        return (*self.inner.tools, REMEMBER.spec, RECALL.spec)

    @property
    def instructions(self) -> str:
        return f"{self.inner.instructions}\n{NOTE}".strip()

    async def reset(self) -> list[Message]:
        self._new_episode()
        return await self.inner.reset()

    async def step(self, action: Sequence[Message]) -> StepResult:
        last = action[-1] if action else None
        if last is not None and self._toolbox.handles(last) and last.tool_name in MEMORY_TOOLS:
            self._calls += 1
            dispatch = await self._toolbox.dispatch(last)
            if dispatch.failure is not None:  # in-memory tools cannot time out, but never scored if they do
                return StepResult(failure=dispatch.failure)
            assert dispatch.observation is not None
            return StepResult(observations=(dispatch.observation,), info={"tool_error": float(dispatch.kind != "ok")})
        result = await self.inner.step(action)
        if result.terminated or result.truncated:
            return dataclasses.replace(result, info={**result.info, "memory_calls": float(self._calls)})
        return result

    async def close(self) -> None:
        await self.inner.close()


class MemoryFactory:
    """``inner``'s tasks and name; each episode is ``inner``'s env wrapped in :class:`MemoryEnv`."""

    def __init__(self, inner: EnvFactory) -> None:
        self.inner = inner
        self.name = inner.name

    def tasks(self, split: Split) -> Sequence[Task]:
        return self.inner.tasks(split)

    def make(self, task: Task) -> MemoryEnv:
        return MemoryEnv(self.inner.make(task))


def with_memory(factory: EnvFactory) -> MemoryFactory:
    """Every episode of ``factory`` gains the ``remember`` / ``recall`` tools."""
    return MemoryFactory(factory)
