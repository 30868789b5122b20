"""Metrics: per-step summaries of rollouts and a JSONL writer (one JSON object per line, flushed per write).

Keys are namespaced: ``rollout/`` (what the agent did; ``rollout/terms/<name>``: each reward term the env reports),
``env/`` (environment faults by class),
``train/`` (the update), ``mismatch/`` (sampler vs trainer), ``time/`` (where the wall clock went),
``eval/`` (held-out).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from harmonyrl.types import ROLE_TERM, Trajectory


def summarize_rollouts(trajs: Sequence[Trajectory], prefix: str = "rollout") -> dict[str, float]:
    """Aggregate statistics of a set of episodes. Failed episodes are excluded from the agent metrics."""
    n = len(trajs)
    ok = [t for t in trajs if t.failure is None]
    m = max(len(ok), 1)
    failures = Counter(t.failure.kind for t in trajs if t.failure is not None)
    tool_calls = [sum(1 for turn in t.turns for msg in turn.sampled if msg.is_tool_call) for t in ok]
    out: dict[str, float] = {
        f"{prefix}/episodes": float(n),
        f"{prefix}/reward": sum(t.reward for t in ok) / m,
        f"{prefix}/success": sum(t.success for t in ok) / m,
        f"{prefix}/tool_call_rate": sum(c > 0 for c in tool_calls) / m,
        f"{prefix}/tool_calls_per_episode": sum(tool_calls) / m,
        f"{prefix}/parse_error_rate": sum(any(tu.parse_error for tu in t.turns) for t in ok) / m,
        f"{prefix}/truncated_rate": sum(t.truncated for t in ok) / m,
        f"{prefix}/completion_rate": sum(t.terminated and not t.truncated for t in ok) / max(n, 1),
        f"{prefix}/response_tokens": sum(t.num_sampled for t in ok) / m,
        f"{prefix}/episode_tokens": sum(len(t.token_ids) for t in ok) / m,
        f"{prefix}/turns": sum(len(t.turns) for t in ok) / m,
        f"{prefix}/parity_mismatches": float(sum(t.parity_mismatches for t in trajs)),
        f"{prefix}/failed": float(n - len(ok)),
    }
    for kind, count in sorted(failures.items()):
        out[f"env/failure_{kind}"] = float(count)
    out.update(term_means(ok, prefix))
    return out


def term_means(ok: Sequence[Trajectory], prefix: str) -> dict[str, float]:
    """``<prefix>/terms/<name>``: each reward term the env reported (a verifiers ``@vf.reward``/``@vf.metric``, a
    game's ``win`` or ``invalid_moves`` …), averaged over the episodes that ran without a fault, an episode that did
    not report it counting 0 (one cut short before the env scored it reported nothing). The seat index is left out."""
    names = sorted({k for t in ok for k in t.reward_terms if k != ROLE_TERM})
    m = max(len(ok), 1)
    return {f"{prefix}/terms/{k}": sum(t.reward_terms.get(k, 0.0) for t in ok) / m for k in names}


def time_split(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """Summed per-episode generation and tool seconds (they overlap across episodes, so they exceed wall)."""
    gen = sum(turn.generation_s for t in trajs for turn in t.turns)
    tool = sum(turn.tool_s for t in trajs for turn in t.turns)
    return {"time/episode_generation_s": gen, "time/episode_tool_s": tool}


class JsonlWriter:
    """Appends one JSON line per step. Non-finite floats are written as strings so the file stays JSON."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fh: IO[str] = path.open("a", encoding="utf-8")

    def write(self, step: int, metrics: Mapping[str, float], phase: str) -> None:
        row: dict[str, object] = {"step": step, "phase": phase}
        for k, v in metrics.items():
            row[k] = v if math.isfinite(v) else str(v)
        self._fh.write(json.dumps(row) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


def read_metrics(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
