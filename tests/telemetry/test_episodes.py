"""Episode records: the exact schema from a Trajectory, append/stream round trip, and which episodes are shown."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from synthetic_run import trajectory

from harmonyrl.telemetry.episodes import append_episodes, episode_to_json, iter_episodes, select_episodes
from harmonyrl.types import ROLE_TERM, Failure


def test_episode_to_json_exact_schema() -> None:
    traj = trajectory("calc-7", 1.0, Failure("tool_crash", "boom"))
    assert episode_to_json(traj, step=3) == {
        "step": 3,
        "task_id": "calc-7",
        "prompt": "What is 2 + 2?",
        "expected_answer": "4",  # for people reading the record: never shown to the model
        "reward": 1.0,
        "reward_terms": {"correct": 1.0},
        "failure": "tool_crash",
        "turns": [
            {
                "sampled": [
                    {
                        "role": "assistant",
                        "channel": "analysis",
                        "recipient": None,
                        "content": "I should use the tool.",
                    },
                    {
                        "role": "assistant",
                        "channel": "commentary",
                        "recipient": "functions.calculator",
                        "content": '{"expression": "2+2"}',
                    },
                ],
                "parse_error": None,
                "observations": [
                    {
                        "role": "tool",
                        "channel": "commentary",
                        "recipient": "assistant",
                        "content": "4",
                        "name": "functions.calculator",
                    }
                ],
            },
            {
                "sampled": [
                    {"role": "assistant", "channel": "final", "recipient": None, "content": "The answer is 4."}
                ],
                "parse_error": None,
                "observations": [],
            },
        ],
    }


def test_a_team_line_names_its_role_and_a_single_agent_line_has_none() -> None:
    traj = trajectory("relay-1", 1.0, None)
    planner = dataclasses.replace(traj, reward_terms={"correct": 1.0, ROLE_TERM: 0.0})
    executor = dataclasses.replace(traj, reward_terms={"correct": 1.0, ROLE_TERM: 1.0})
    roles = ("planner", "executor")
    assert episode_to_json(planner, 1, roles)["team_role"] == "planner"
    assert episode_to_json(executor, 1, roles)["team_role"] == "executor"
    assert "team_role" not in episode_to_json(traj, 1, roles)  # no role term: one agent
    assert "team_role" not in episode_to_json(executor, 1)  # no role names given


def test_non_finite_reward_keeps_the_line_json() -> None:
    line = json.dumps(episode_to_json(trajectory("t", float("nan")), 0), allow_nan=False)
    assert json.loads(line)["reward"] == "nan"


def test_append_and_stream_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "rollouts" / "e.jsonl"  # parent created on first write
    append_episodes(path, [trajectory("a", 0.0), trajectory("b", 1.0)], step=1)
    append_episodes(path, [], step=2)
    append_episodes(path, [trajectory("c", 0.5)], step=3)
    got = list(iter_episodes(path))
    assert [(e["step"], e["task_id"], e["reward"]) for e in got] == [(1, "a", 0.0), (1, "b", 1.0), (3, "c", 0.5)]


def test_cut_off_last_line_is_dropped_but_corruption_is_named(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    append_episodes(path, [trajectory("a", 0.0)], step=1)
    whole = path.read_text()
    path.write_text(whole + whole[:40])  # killed mid-write: no trailing newline
    assert [e["task_id"] for e in iter_episodes(path)] == ["a"]
    path.write_text(whole + "{oops\n" + whole)
    with pytest.raises(ValueError, match=r"e\.jsonl:2: not valid JSON"):
        list(iter_episodes(path))
    path.write_text('{"step": "one", "turns": []}\n')
    with pytest.raises(ValueError, match=r"e\.jsonl:1: not an episode"):
        list(iter_episodes(path))


def _ep(step: int, reward: float, failure: str | None = None) -> dict[str, object]:
    return {"step": step, "task_id": f"s{step}r{reward}", "reward": reward, "failure": failure, "turns": []}


def test_selection_prefers_failures_then_last_and_first_step_by_outcome() -> None:
    eps = [_ep(s, r) for s in range(1, 6) for r in (0.0, 0.5, 1.0)] + [_ep(3, 0.0, "tool_timeout")]
    # 6 slots: 1 failure (a quarter, at least one), then 3 from the last step and 2 from the first
    chosen = select_episodes(iter(eps), 6)
    assert len(chosen) == 6
    assert [e["step"] for e in chosen] == sorted(e["step"] for e in chosen)
    assert sum(1 for e in chosen if e["failure"]) == 1
    assert {e["step"] for e in chosen if not e["failure"]} == {1, 5}  # first and last step only
    assert [e["reward"] for e in chosen if e["step"] == 5] == [1.0, 0.0, 0.5]  # best, worst, then the middle
    assert [e["reward"] for e in chosen if e["step"] == 1] == [1.0, 0.0]
    assert len(select_episodes(iter(eps), 100)) == 7  # only first/last-step episodes and failures are candidates
    assert select_episodes(iter(eps), 0) == []
    assert len(select_episodes(iter(eps[:2]), 8)) == 2  # fewer than asked: all of them
