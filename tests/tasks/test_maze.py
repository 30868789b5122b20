"""Maze env: generated mazes and disjoint splits, exact rewards for scripted walks, the BFS expert, the loop."""

from __future__ import annotations

import asyncio
import functools
import json
import random
from collections.abc import Sequence

import pytest
from typer.testing import CliRunner

from fakes import ScriptedEngine
from harmonyrl.cli import app
from harmonyrl.config import load_config
from harmonyrl.envs.checker import assert_env_ok
from harmonyrl.envs.memory import MemoryFactory
from harmonyrl.envs.reward import RewardWeights
from harmonyrl.harmony.render import render_completion
from harmonyrl.harmony.tokenizer import HarmonyTokenizer
from harmonyrl.rollout.agent_loop import EpisodeLimits, run_episode
from harmonyrl.tasks.factory import expert_for, make_factory
from harmonyrl.tasks.maze import STEP, Maze, MazeFactory, canonical_key, expert_demo
from harmonyrl.types import Message, SamplingParams, StepResult, Task


def small() -> MazeFactory:
    return MazeFactory(seed=0, n_train=300, n_test=30)


FACTORY = small()
TRAIN, TEST = FACTORY.tasks("train"), FACTORY.tasks("test")
# A fixed 3x3 maze with one way through: a zig-zag from the top-left start to the bottom-right exit.
MAP = "\n".join(["#######",
                 "#S....#",
                 "#####.#",
                 "#.....#",
                 "#.#####",
                 "#....G#",
                 "#######"])  # fmt: skip
TASK = Task("m", "Maze test (3x3). You are at row 0, column 0. Reach the exit at row 2, column 2.", MAP, "train")
PATH = ["east", "east", "south", "west", "west", "south", "east", "east"]


def call(name: str, **args: str) -> list[Message]:
    return [Message("assistant", json.dumps(args), channel="commentary", recipient=f"functions.{name}",
                    content_type="json")]  # fmt: skip


def play(actions: Sequence[Sequence[Message]], weights: RewardWeights | None = None, max_turns: int = 40):
    factory = MazeFactory(n_train=1, n_test=1, max_turns=max_turns, weights=weights or RewardWeights())

    async def go() -> list[StepResult]:
        env = factory.make(TASK)
        await env.reset()
        return [await env.step(a) for a in actions]

    return asyncio.run(go())


def test_check_env_passes() -> None:
    assert_env_ok(FACTORY, rebuild=small)
    result = CliRunner().invoke(app, ["check-env", "harmonyrl.tasks.maze:MazeFactory", "--tasks", "3"])
    assert result.exit_code == 0 and "environment contract OK" in result.output, result.output


def test_shortest_walk_earns_exact_reward() -> None:
    assert Maze.parse(MAP).shortest_path((0, 0)) == PATH
    results = play([call("look"), *(call("move", direction=d) for d in PATH)])
    assert json.loads(results[0].observations[0].content) == {"at": [0, 0], "open": ["east"]}
    assert json.loads(results[3].observations[0].content) == {"at": [1, 2], "open": ["north", "west"]}
    assert all(r.reward == 0.0 and not r.terminated and not r.truncated for r in results[:-1])
    end = results[-1]
    assert (end.reward, end.terminated, end.truncated, end.observations) == (1.0, True, False, ())
    assert {k: end.info[k] for k in ("correct", "turns", "moves", "bumps", "invalid_calls", "shortest")} == {
        "correct": 1.0, "turns": 9.0, "moves": 8.0, "bumps": 0.0, "invalid_calls": 0.0, "shortest": 8.0}  # fmt: skip
    [*_, costed] = play([call("move", direction=d) for d in PATH], RewardWeights(step_cost=0.05))
    assert costed.reward == pytest.approx(1.0 - 8 * 0.05)


def test_bumps_and_bad_calls_are_observations_not_failures() -> None:
    bump, bad, unknown = play([call("move", direction="south"), call("move", direction="up"), call("jump")])
    assert bump.failure is None and not bump.terminated
    assert json.loads(bump.observations[0].content) == {"blocked": "south", "at": [0, 0], "open": ["east"]}
    assert bad.info == {"tool_error": 1.0} and "invalid arguments: direction" in bad.observations[0].content
    assert "unknown tool 'jump'" in unknown.observations[0].content and not unknown.terminated
    # one invalid call costs the format term, not the outcome
    weights = RewardWeights(outcome=0.5, format=0.5)
    *_, clean = play([call("move", direction=d) for d in PATH], weights)
    *_, sloppy = play([call("move", direction="up"), *(call("move", direction=d) for d in PATH)], weights)
    assert (clean.reward, sloppy.reward, sloppy.info["invalid_calls"]) == (1.0, 0.5, 1.0)


def test_giving_up_terminates_and_the_turn_limit_truncates() -> None:
    [quit_] = play([[Message("assistant", "I give up.", channel="final")]])
    assert (quit_.reward, quit_.terminated, quit_.truncated, quit_.info["correct"]) == (0.0, True, False, 0.0)
    # the format term pays a clean game to the exit or to the turn limit, never a clean start and a quit
    weights = RewardWeights(outcome=0.8, format=0.2)
    *_, quit_after_look = play([call("look"), [Message("assistant", "4", channel="final")]], weights)
    *_, to_the_limit = play([call("look"), call("look")], weights, max_turns=2)
    assert (quit_after_look.reward, quit_after_look.info["reward/format"]) == (0.0, 0.0)
    assert to_the_limit.reward == pytest.approx(0.2) and to_the_limit.truncated
    first, second, third = play([call("look"), call("move", direction="east"), call("look")], max_turns=3)
    assert not first.truncated and not second.truncated
    assert (third.reward, third.terminated, third.truncated, third.info["turns"]) == (0.0, False, True, 3.0)
    with pytest.raises(RuntimeError, match="after the episode ended"):
        play([call("look"), call("look")], max_turns=1)


def test_mazes_are_connected_distinct_and_splits_disjoint_up_to_symmetry() -> None:
    for task in (*TRAIN, *TEST):
        maze = Maze.parse(task.answer)
        seen, todo = {maze.start}, [maze.start]
        while todo:
            r, c = todo.pop()
            for d in maze.open_ways((r, c)):
                nxt = (r + STEP[d][0], c + STEP[d][1])
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        assert len(seen) == 16 and len(maze.shortest_path(maze.start)) >= 4
        assert f"row {maze.start[0]}, column {maze.start[1]}" in task.prompt
    assert len({t.prompt for t in (*TRAIN, *TEST)}) == 330
    big = MazeFactory(seed=0, n_train=600, n_test=60)
    assert (big.tasks("train")[:300], big.tasks("test")[:30]) == (TRAIN, TEST)
    other = MazeFactory(seed=1, n_train=300, n_test=30)
    keys = {
        s: {canonical_key(Maze.parse(t.answer)) for f in (big, other) for t in f.tasks(s)} for s in ("train", "test")
    }
    assert not keys["train"] & keys["test"]
    maze = Maze.parse(TEST[0].answer)
    rotated = "\n".join("".join(col) for col in zip(*maze.grid[::-1], strict=True))
    assert canonical_key(Maze.parse(rotated)) == canonical_key(maze)


@pytest.mark.parametrize(
    ("text", "message"),
    [("###\n#S#\n###", "odd square"), (MAP.replace("G", "."), "exactly one 'S'"),
     (MAP.replace("#S", ".S"), "border is all '#'"), (MAP.replace("S.", "#S"), "each in a room")],
)  # fmt: skip
def test_bad_maps_are_rejected(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Maze.parse(text)


def replay(task: Task, demo: list[Message], factory: MazeFactory = FACTORY) -> StepResult:
    """Feed the demo's assistant messages to the env; its observations must equal the demo's, one for one."""

    async def go() -> StepResult:
        env = factory.make(task)
        await env.reset()
        calls = [m for m in demo if m.role == "assistant"]
        shown = [m for m in demo if m.role == "tool"]
        for i, msg in enumerate(calls):
            result = await env.step([msg])
            if i < len(shown):
                assert result.observations == (shown[i],)
        return result

    return asyncio.run(go())


def test_expert_walks_the_shortest_path_or_recovers_from_mistakes() -> None:
    for i, task in enumerate(TRAIN[:20]):
        demo = expert_demo(task, random.Random(i), p_tool=1.0)
        end = replay(task, demo)
        assert (end.reward, end.info["moves"], end.info["bumps"]) == (1.0, end.info["shortest"], 0.0)
    ends = [replay(t, expert_demo(t, random.Random(i), p_tool=0.7, p_verbose=0.2)) for i, t in enumerate(TRAIN[:60])]
    assert sum(e.info["bumps"] for e in ends) > 10 and sum(e.info["moves"] > e.info["shortest"] for e in ends) > 10
    assert sum(e.reward for e in ends) >= 55  # mistakes cost turns; the 40-turn budget rarely runs out
    assert expert_demo(TRAIN[1], random.Random(3)) == expert_demo(TRAIN[1], random.Random(3))


def test_long_episode_through_the_agent_loop() -> None:
    tok = HarmonyTokenizer.load_default()
    task = TRAIN[0]
    calls = [m for m in expert_demo(task, random.Random(0), p_tool=1.0) if m.role == "assistant"]
    engine = ScriptedEngine([render_completion(tok, [m]) for m in calls])
    params = SamplingParams(stop_ids=tok.special.stop_ids)
    traj = asyncio.run(run_episode(engine, FACTORY.make(task), tok, params, EpisodeLimits(40, 64, 4096),
                                   task_id=task.id, group_id=0, seed=0))  # fmt: skip
    assert (traj.reward, traj.terminated, traj.success, len(traj.turns)) == (1.0, True, True, len(calls))
    assert traj.parity_mismatches == 0 and traj.reward_terms["turns"] == len(calls)


def test_config_wiring_with_memory() -> None:
    config = load_config(overrides=["env.name=maze", "env.size=3", "env.n_train=20", "env.n_test=3",
                                    "env.memory=true", "env.reward.step_cost=0.01"])  # fmt: skip
    factory = make_factory(config.env, seed=0)
    assert isinstance(factory, MemoryFactory) and isinstance(factory.inner, MazeFactory)
    assert factory.name == "maze" and factory.inner.size == 3 and factory.inner.weights.step_cost == 0.01
    assert [t.name for t in factory.make(factory.tasks("train")[0]).tools] == ["look", "move", "remember", "recall"]
    expert = expert_for(config.env)  # the scripted expert with the env's p_tool / p_verbose bound
    assert isinstance(expert, functools.partial) and expert.func is expert_demo
    assert expert.keywords == {"p_tool": config.env.p_tool, "p_verbose": config.env.p_verbose}
