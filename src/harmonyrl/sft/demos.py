"""Demonstrations from a file (``sft.demos``): checked, replayed through the env's tools, rendered like rollouts.

Each row of the file becomes either a :class:`~harmonyrl.sft.train.Demo` or a reason it was skipped, never
nothing: a row that does not parse, names an unknown or held-out task, calls a tool the env does not have,
does not fit ``rollout.max_seq_len``, or (with ``sft.demos_on_mismatch=drop``) records a tool result the env's
own tool does not reproduce is skipped with an :class:`DemoIssue` naming its file, line and cause.

A row with a ``task_id`` is one of the env's train tasks: its prompt is what ``env.reset()`` gives in rollouts,
and every tool call in it runs through ``env.step`` in order, each real result compared with the recorded one.
A row without one is rendered from its own messages (the env's system and developer messages are put in front
when it has none), and its tool calls are counted as unverified. See docs/demonstrations.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pydantic

from harmonyrl.envs.base import Env, EnvFactory
from harmonyrl.errors import DemoFileError
from harmonyrl.harmony.demo_schema import DemoConversation
from harmonyrl.harmony.tokenizer import Codec
from harmonyrl.rollout.agent_loop import initial_messages
from harmonyrl.rollout.show import harmony_header
from harmonyrl.sft.demo_files import Row, read_rows
from harmonyrl.sft.train import Demo, render_demo
from harmonyrl.types import Message, Task

MismatchPolicy = Literal["drop", "keep", "error"]
IssueKind = Literal[
    "invalid", "unknown_task", "held_out_task", "unknown_tool", "too_long", "tool_mismatch", "prompt_differs",
    "unverified",
]  # fmt: skip


@dataclass(frozen=True)
class DemoIssue:
    """One thing found in one row; ``skipped`` says whether the row was left out of the warm start for it."""

    file: str
    unit: str
    """``"line"`` (JSONL, 1-based) or ``"row"`` (parquet, datasets; 0-based)."""
    number: int
    kind: IssueKind
    detail: str
    skipped: bool


@dataclass(frozen=True)
class FileDemos:
    """What a demonstrations file gave: the rendered demos in file order, and every issue found on the way."""

    file: str
    rows: int
    demos: list[Demo]
    issues: list[DemoIssue]

    @property
    def skipped(self) -> int:
        """Rows left out (each skipped row has exactly one skipping issue)."""
        return sum(i.skipped for i in self.issues)


@dataclass(frozen=True)
class _Context:
    file: str
    codec: Codec
    factory: EnvFactory
    train: Mapping[str, Task]
    test_ids: frozenset[str]
    header: list[Message]
    """The env's system and developer messages, for rows that bring none of their own."""
    header_tools: frozenset[str]
    max_seq_len: int
    on_mismatch: MismatchPolicy


def shorten(text: str, width: int = 80) -> str:
    """``text`` on one line, cut to ``width`` characters with an ellipsis."""
    flat = text.replace("\n", "\\n")
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def _shown(msg: Message | None) -> str:
    return "(none)" if msg is None else shorten(f"{harmony_header(msg)}: {msg.content}")


async def load_demos(
    codec: Codec, factory: EnvFactory, path: Path, max_seq_len: int, on_mismatch: MismatchPolicy = "drop"
) -> FileDemos:
    """Every row of ``path`` checked, replayed and rendered; a file unreadable as a whole is a ``DemoFileError``."""
    rows = read_rows(path)
    train = factory.tasks("train")
    header, tools = await _env_header(factory, train)
    test_ids = frozenset(t.id for split in ("validation", "test") for t in factory.tasks(split))  # never shown
    ctx = _Context(
        str(path), codec, factory, {t.id: t for t in train}, test_ids, header, tools, max_seq_len, on_mismatch
    )
    demos: list[Demo] = []
    issues: list[DemoIssue] = []
    for row in rows:
        demo, found = await _row_demo(ctx, row)
        issues += [DemoIssue(ctx.file, row.unit, row.number, kind, detail, skip) for kind, detail, skip in found]
        if demo is not None:
            demos.append(demo)
    return FileDemos(str(path), len(rows), demos, issues)


Found = list[tuple[IssueKind, str, bool]]
"""Issues of one row: (kind, detail, skipped)."""


async def _row_demo(ctx: _Context, row: Row) -> tuple[Demo | None, Found]:
    """One row's demo (None if skipped) and what was found in it."""
    if row.error is not None:
        return None, [("invalid", row.error, True)]
    try:
        conv = DemoConversation.model_validate(row.value)
    except pydantic.ValidationError as e:
        return None, [("invalid", _schema_error(e), True)]
    own_prompt, turns = conv.split()
    found: Found = []
    if conv.task_id is None:
        prefix, tools = _with_header(ctx.header, own_prompt), ctx.header_tools
        if any(m.is_tool_call for m in turns):
            found.append(("unverified", "no task_id: its tool calls were not replayed", False))
    else:
        if conv.task_id not in ctx.train:
            held_out = conv.task_id in ctx.test_ids
            kind: IssueKind = "held_out_task" if held_out else "unknown_task"
            what = "is a held-out (validation or test) task" if held_out else "is not one of the env's train tasks"
            return None, [(kind, f"task_id {conv.task_id!r} {what}", True)]
        env = ctx.factory.make(ctx.train[conv.task_id])
        try:
            prefix, tools, replayed = await _replay_task(env, own_prompt, turns, len(own_prompt))
        finally:
            await env.close()
        found += replayed
    if unknown := sorted({m.recipient or "" for m in turns if m.is_tool_call} - {f"functions.{t}" for t in tools}):
        return None, [*found, ("unknown_tool", f"unknown tool {unknown[0]!r}", True)]
    mismatch = [f for f in found if f[0] == "tool_mismatch"]
    if mismatch and ctx.on_mismatch == "error":
        raise DemoFileError(
            f"sft.demos: {ctx.file} {row.unit} {row.number}: {mismatch[0][1]} (sft.demos_on_mismatch=error)"
        )
    if mismatch and ctx.on_mismatch == "drop":
        first = found.index(mismatch[0])  # the row is skipped once, for its first mismatch
        return None, [(kind, detail, n == first) for n, (kind, detail, _) in enumerate(found)]
    demo = render_demo(ctx.codec, prefix, turns)
    if len(demo.ids) > ctx.max_seq_len:
        return None, [*found, ("too_long", f"{len(demo.ids)} tokens > rollout.max_seq_len={ctx.max_seq_len}", True)]
    return demo, found


def _schema_error(e: pydantic.ValidationError) -> str:
    errors = e.errors()
    first = errors[0]
    where = ".".join(str(p) for p in first["loc"]) or "conversation"
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"schema: {where}: {first['msg']}{more}"


async def _env_header(factory: EnvFactory, train: Sequence[Task]) -> tuple[list[Message], frozenset[str]]:
    """The system and developer messages and the tool names of the env (of its first train task)."""
    if not train:
        return [], frozenset()
    env = factory.make(train[0])
    try:
        await env.reset()
        header = initial_messages(env, [])
        tools = frozenset(t.name for t in env.tools)
    finally:
        await env.close()
    return header, tools


def _with_header(header: Sequence[Message], prompt: Sequence[Message]) -> list[Message]:
    """``prompt`` with the env's system / developer message in front where it has none of its own."""
    roles = {m.role for m in prompt}
    return [*(m for m in header if m.role not in roles), *prompt]


async def _replay_task(
    env: Env, own_prompt: Sequence[Message], turns: Sequence[Message], offset: int
) -> tuple[list[Message], frozenset[str], Found]:
    """The env's own prompt and tools, and the differences between the recorded conversation and the env's."""
    first = await env.reset()
    prefix = initial_messages(env, first)
    tools = frozenset(t.name for t in env.tools)
    found: Found = []
    if own_prompt and list(own_prompt) not in (prefix, list(first)):
        found.append(("prompt_differs", _first_difference(own_prompt, first, prefix), False))
    known = {f"functions.{t}" for t in tools}
    if all(m.recipient in known for m in turns if m.is_tool_call):  # an unknown tool is reported, not replayed
        found += await replay(env, turns, offset)
    return prefix, tools, found


def _first_difference(own: Sequence[Message], first: Sequence[Message], prefix: Sequence[Message]) -> str:
    """Where the row's own prompt departs from the env's (compared with the full prompt if it has a system one)."""
    env_side = prefix if own and own[0].role == "system" else first
    i = next((i for i, (a, b) in enumerate(zip(own, env_side, strict=False)) if a != b), min(len(own), len(env_side)))
    got, want = own[i] if i < len(own) else None, env_side[i] if i < len(env_side) else None
    return f"message {i}: the env's prompt is used; file {_shown(got)} vs env {_shown(want)}"


async def replay(env: Env, turns: Sequence[Message], offset: int = 0) -> Found:
    """Step ``env`` (already reset) through each tool-calling assistant turn of ``turns``, in order; one
    ``tool_mismatch`` per recorded tool result that differs from the env's (message index ``offset + i``).
    The final answer is not stepped: grading it changes nothing in the demonstration."""
    found: Found = []
    turn: list[Message] = []
    i = 0
    while i < len(turns):
        turn.append(turns[i])
        i += 1
        if not turn[-1].is_tool_call:
            continue
        result = await env.step(turn)
        turn, start = [], i
        while i < len(turns) and turns[i].role == "tool":
            i += 1
        recorded, real = list(turns[start:i]), list(result.observations)
        if result.failure is not None:
            detail = f"the tool failed ({result.failure.kind}: {shorten(result.failure.detail)})"
            found.append(("tool_mismatch", f"message {offset + start}: {detail}", False))
        for j in range(max(len(recorded), len(real))):
            got, want = (recorded[j] if j < len(recorded) else None), (real[j] if j < len(real) else None)
            if got != want:
                where = f"message {offset + start + j}"
                found.append(("tool_mismatch", f"{where}: recorded {_shown(got)} vs real {_shown(want)}", False))
        if (result.terminated or result.truncated) and i < len(turns):
            found.append(("tool_mismatch", f"message {offset + i}: the env ended the episode before it", False))
            break
    return found
