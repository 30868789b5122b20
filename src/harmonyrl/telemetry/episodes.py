"""Episodes as readable JSON lines (``RUN_DIR/rollouts/*.jsonl``), so a report can show what the agent did.

One line per episode::

    {"step": int, "task_id": str, "prompt": str, "expected_answer": str, "reward": float,
     "reward_terms": {name: float}, "failure": str | null, ["team_role": str,] ["versions": [int, ...],]
     "turns": [{"sampled": [message, ...], "parse_error": str | null, "observations": [message, ...]}]}

where a sampled message is ``{"role", "channel", "recipient", "content"}`` and an observation (a tool result)
additionally carries ``"name"`` (``"functions.calculator"``), because for tool messages the author, not the
recipient, says which tool answered. ``failure`` is the failure *kind* (``"tool_timeout"`` …), a class the
report can group by. ``prompt`` and ``expected_answer`` are the task's (``Task.prompt``, ``Task.answer``; ``""``
where the env has no expected answer), so a reader sees what was asked and what would have scored beside what the
model did and its ``reward_terms``; the answer is for people only, never shown to the model. ``team_role`` is
present only on a team episode's line (docs/multiagent.md): the name of the role that played this trajectory,
so the record says who wrote each line of a team episode. ``versions`` is present only on an episode that a
partial rollout continued across weight updates (``rl.async.partial``, docs/async.md): the policy versions that
sampled it, oldest first. Token ids and log-probs are left out on purpose: this
file is for people; the lossless record of a step is the rollout store.

A view cut from the one plain record of :mod:`harmonyrl.trajectory_codec`, written with the standard library.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from harmonyrl.trajectory_codec import turn_to_plain
from harmonyrl.types import ROLE_TERM, Trajectory, Turn

Episode = dict[str, Any]
"""One decoded line of a rollouts file (JSON, so its values are only known by the schema above)."""


_SAMPLED = ("role", "channel", "recipient", "content")
_OBSERVED = (*_SAMPLED, "name")


def _turn(turn: Turn) -> dict[str, Any]:
    """The readable view of one turn, cut from the codec's plain record (:mod:`harmonyrl.trajectory_codec`)."""
    plain = turn_to_plain(turn)
    return {
        "sampled": [{k: m[k] for k in _SAMPLED} for m in plain["sampled"]],
        "parse_error": plain["parse_error"],
        "observations": [{k: m[k] for k in _OBSERVED} for m in plain["observations"]],
    }


def _role(traj: Trajectory, roles: Sequence[str]) -> dict[str, str]:
    """``{"team_role": name}`` for a team trajectory whose role index names one of ``roles``; else nothing."""
    index = traj.reward_terms.get(ROLE_TERM)
    if index is None or not roles or not 0 <= int(index) < len(roles):
        return {}
    return {"team_role": roles[int(index)]}


def episode_to_json(traj: Trajectory, step: int, roles: Sequence[str] = ()) -> Episode:
    """The JSON-ready record of one episode at RL step ``step`` (schema in the module docstring); ``roles``:
    a team env's role names, in order (empty for one agent)."""
    reward = traj.reward if math.isfinite(traj.reward) else str(traj.reward)  # keep the line valid JSON
    return {
        "step": step,
        "task_id": traj.task_id,
        "prompt": traj.task_prompt,
        "expected_answer": traj.expected_answer,
        "reward": reward,
        "reward_terms": {k: v if math.isfinite(v) else str(v) for k, v in traj.reward_terms.items()},
        "failure": traj.failure.kind if traj.failure is not None else None,
        **_role(traj, roles),
        **_versions(traj),
        "turns": [_turn(turn) for turn in traj.turns],
    }


def _versions(traj: Trajectory) -> dict[str, list[int]]:
    """``{"versions": [v, …]}``: the policy versions that sampled the episode, oldest first, for an episode that a
    partial rollout continued across a weight update (docs/async.md); nothing for one sampled by one version."""
    if not traj.token_versions:
        return {}
    return {"versions": sorted({v for v in traj.token_versions if v >= 0})}


def append_episodes(path: Path, trajs: Iterable[Trajectory], step: int, roles: Sequence[str] = ()) -> None:
    """Append one line per episode to ``path`` (parents created), flushed before returning; ``roles`` as in
    :func:`episode_to_json`.

    Lines are built first and written with one call, so a crash mid-call loses the step's lines rather than
    leaving most of them; a reader still tolerates a cut-off last line.
    """
    lines = "".join(json.dumps(episode_to_json(t, step, roles)) + "\n" for t in trajs)
    if not lines:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as fh:
        fh.write(lines)


def iter_episodes(path: Path) -> Iterator[Episode]:
    """Episodes of one rollouts file, streamed (a long run's file need not fit in memory).

    Raises ``ValueError`` naming ``file:line`` for a corrupt line. A cut-off final line (no trailing newline:
    the writer was killed mid-write) is dropped, not an error.
    """
    with path.open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                if not line.endswith("\n"):
                    return
                raise ValueError(f"{path}:{number}: not valid JSON ({e.msg})") from None
            if (
                not isinstance(row, dict)
                or not isinstance(row.get("step"), int)
                or not isinstance(row.get("turns"), list)
            ):
                raise ValueError(f"{path}:{number}: not an episode (needs an int 'step' and a 'turns' list)")
            yield row


def _outcome_order(episodes: list[Episode]) -> list[Episode]:
    """Best, worst, second best, second worst …: a few episodes then show both what works and what does not."""
    ranked = sorted(episodes, key=lambda e: float(e.get("reward", 0.0)), reverse=True)
    out: list[Episode] = []
    lo, hi = 0, len(ranked) - 1
    while lo <= hi:
        out.append(ranked[lo])
        if hi != lo:
            out.append(ranked[hi])
        lo, hi = lo + 1, hi - 1
    return out


def select_episodes(episodes: Iterable[Episode], limit: int) -> list[Episode]:
    """Up to ``limit`` episodes worth showing, in step order, keeping only candidates while streaming.

    Environment failures come first (rare, and the reason someone opens the report), up to a quarter of the
    slots; the rest is split between the last step (the trained policy) and the first (the starting point),
    each mixed by outcome.
    """
    if limit <= 0:
        return []
    failed: list[Episode] = []
    first: list[Episode] = []
    last: list[Episode] = []
    for e in episodes:
        if e.get("failure"):
            if len(failed) < max(1, limit // 4):
                failed.append(e)
            continue
        step = e["step"]
        if not first or step < first[0]["step"]:
            first = [e]
        elif step == first[0]["step"]:
            first.append(e)
        if not last or step > last[0]["step"]:
            last = [e]
        elif step == last[0]["step"]:
            last.append(e)
    if first and last and first[0]["step"] == last[0]["step"]:
        first = []
    late, early = _outcome_order(last), _outcome_order(first)
    slots = limit - len(failed)
    n_early = min(len(early), slots // 2)
    chosen = failed + late[: slots - n_early] + early[:n_early]
    chosen += early[n_early : n_early + limit - len(chosen)]
    return sorted(chosen, key=lambda e: e["step"])
