"""``harmonyrl show RUN_DIR --step N``: recorded episodes in readable harmony form, in the terminal.

Each message is shown with its harmony header (``assistant<|channel|>commentary to=functions.calculator
<|constrain|>json``) and then its content, so what is on screen maps one to one onto what the model sampled
and saw, without the token soup. Every piece of text from the model or a tool is a rich ``Text``, never
markup: model output full of ``[brackets]`` must print as written.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.text import Text

from harmonyrl.types import Message, Trajectory, Turn


def harmony_header(msg: Message) -> str:
    """The message's harmony header as the renderer writes it: author, channel, recipient, constraint."""
    head = msg.name if msg.role == "tool" and msg.name else msg.role
    if msg.channel is not None:
        head += f"<|channel|>{msg.channel}"
    if msg.recipient is not None:
        head += f" to={msg.recipient}"
    if msg.content_type is not None:
        head += f" <|constrain|>{msg.content_type}"
    return head


def _message(msg: Message, observation: bool) -> Text:
    style = "yellow" if observation else "cyan" if msg.is_tool_call else "green" if msg.channel == "final" else ""
    text = Text(harmony_header(msg), style=f"bold {style}".strip())
    text.append("\n")
    text.append(msg.content)
    return text


def _turn(number: int, turn: Turn) -> list[RenderableType]:
    head = f"turn {number}  (generation {turn.generation_s:.3f} s, tool {turn.tool_s:.3f} s)"
    parts: list[RenderableType] = [Text(head, style="dim")]
    parts += [_message(m, observation=False) for m in turn.sampled]
    if turn.parse_error is not None:
        parts.append(Text(f"parse error: {turn.parse_error}", style="bold red"))
    parts += [_message(m, observation=True) for m in turn.observations]
    return parts


def _outcome(traj: Trajectory) -> Text:
    ending = "terminated" if traj.terminated else "truncated" if traj.truncated else "stopped"
    text = Text(f"reward {traj.reward:g}  ({ending}")
    if traj.reward_terms:
        text.append(", " + " ".join(f"{k}={v:g}" for k, v in traj.reward_terms.items()))
    text.append(f", {traj.num_sampled} sampled tokens of {len(traj.token_ids)})")
    if traj.parity_mismatches:
        text.append(f"  parity mismatches: {traj.parity_mismatches}", style="red")
    if traj.failure is not None:
        text.append(f"\nfailure {traj.failure.kind}: {traj.failure.detail}", style="bold red")
    return text


def _task(traj: Trajectory) -> list[RenderableType]:
    """The task's prompt and expected answer (for people: the model never saw the answer); nothing for a record
    written before episodes carried them."""
    rows = (("prompt", traj.task_prompt), ("expected answer", traj.expected_answer))
    return [Text.assemble((f"{label}: ", "bold magenta"), text) for label, text in rows if text]


def format_episode(index: int, traj: Trajectory, fit: bool = False) -> Panel:
    """One episode as a panel: the task's prompt and expected answer, its turns in order, then reward, reward terms
    and failure. ``fit``: the panel is as wide as its widest line rather than the console (for a file, whose console
    has no width to fill)."""
    body: list[RenderableType] = _task(traj)
    for number, turn in enumerate(traj.turns, 1):
        body += _turn(number, turn)
    if not traj.turns:
        body.append(Text("(no turns)", style="dim"))
    body.append(_outcome(traj))
    title = Text(f"episode {index}  task {traj.task_id}  group {traj.group_id}")
    border = "red" if traj.failure else "blue"
    return Panel(Group(*body), title=title, title_align="left", border_style=border, expand=not fit)


def format_episodes(
    trajectories: Sequence[Trajectory], limit: int = 8, step: int | None = None, fit: bool = False
) -> Group:
    """The first ``limit`` episodes (in recorded order) as one rich renderable for ``console.print`` (``fit``: see
    :func:`format_episode`)."""
    shown = list(trajectories)[: max(limit, 0)]
    where = f"step {step}: " if step is not None else ""
    header = Text(f"{where}{len(shown)} of {len(trajectories)} episodes", style="bold")
    return Group(header, *(format_episode(i, t, fit) for i, t in enumerate(shown)))


def episodes_text(trajectories: Sequence[Trajectory], limit: int = 8, step: int | None = None, width: int = 100) -> str:
    """:func:`format_episodes` as plain text (no colour codes): for logs, pipes and tests."""
    console = Console(file=io.StringIO(), width=width, color_system=None, force_terminal=False)
    console.print(format_episodes(trajectories, limit, step))
    out = console.file
    assert isinstance(out, io.StringIO)
    return out.getvalue()
