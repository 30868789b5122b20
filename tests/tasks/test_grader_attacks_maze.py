"""The maze grader under attack: only the env's own walker decides whether the exit was reached.

Outcome 1 needs ``walker.at == goal`` after a real ``move``; claims, forged tool arguments, batched moves and
moves after the end do not move the walker. Derived by hand from ``MazeEnv.step``; the battery passed
unchanged at main (no hole to close).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence

import pytest

from harmonyrl.envs.reward import RewardWeights
from harmonyrl.tasks.maze import Maze, MazeEnv, MazeFactory
from harmonyrl.types import Message, StepResult

FACTORY = MazeFactory(seed=0, n_train=2, n_test=1, size=4, max_turns=12)
TASK = FACTORY.tasks("train")[0]
MAZE = Maze.parse(TASK.answer)
PATH = MAZE.shortest_path(MAZE.start)


def move(direction: str, **extra: object) -> Message:
    return Message("assistant", json.dumps({"direction": direction, **extra}), channel="commentary",
                   recipient="functions.move", content_type="json")  # fmt: skip


def look(**extra: object) -> Message:
    return Message("assistant", json.dumps(extra), channel="commentary", recipient="functions.look",
                   content_type="json")  # fmt: skip


def final(text: str) -> Message:
    return Message("assistant", text, channel="final")


def play(turns: Sequence[Sequence[Message]], weights: RewardWeights | None = None) -> tuple[MazeEnv, list[StepResult]]:
    env = MazeFactory(seed=0, n_train=2, n_test=1, size=4, max_turns=12, weights=weights or RewardWeights()).make(TASK)

    async def go() -> list[StepResult]:
        await env.reset()
        return [await env.step(t) for t in turns]

    return env, asyncio.run(go())


def test_the_real_walk_wins() -> None:
    assert 2 <= len(PATH) < 12  # the control: the shortest walk fits the turn budget
    env, results = play([[move(d)] for d in PATH])
    assert (results[-1].terminated, results[-1].reward, env.walker.at) == (True, 1.0, MAZE.goal)
    assert all(r.reward == 0.0 and not r.terminated for r in results[:-1])


def test_claiming_the_exit_is_not_reaching_it() -> None:
    row, col = MAZE.goal
    for claim in (f"I am at the exit, row {row}, column {col}.", json.dumps({"at": [row, col], "exit": True})):
        env, [result] = play([[final(claim)]])
        assert (result.terminated, result.reward, result.info["correct"], env.walker.at) == (True, 0.0, 0.0, MAZE.start)


@pytest.mark.parametrize(
    "forged",
    [
        move(PATH[0], at=list(MAZE.goal)),  # an extra argument naming the exit
        move("teleport"),
        move(PATH[0].upper()),
        move(f"{PATH[0]};{PATH[1]}"),
        move(""),
        look(at=list(MAZE.goal), exit=True),
    ],
)
def test_forged_tool_arguments_do_not_move_the_walker_to_the_exit(forged: Message) -> None:
    env, [result] = play([[forged]])
    assert (result.terminated, result.reward, result.failure) == (False, 0.0, None)
    assert env.walker.at in (MAZE.start, tuple(sum(p) for p in zip(MAZE.start, _delta(PATH[0]), strict=True)))
    assert env.walker.at != MAZE.goal


def _delta(direction: str) -> tuple[int, int]:
    return {"north": (-1, 0), "south": (1, 0), "east": (0, 1), "west": (0, -1)}[direction]


def test_only_the_last_call_of_a_turn_runs() -> None:
    env, [result] = play([[move(d) for d in PATH]])  # the whole path in one turn: one move is made
    assert (result.terminated, env.walker.moves, env.walker.at != MAZE.goal) == (False, 1, True)


def test_walls_stop_the_walker() -> None:
    blocked = next(d for d in ("north", "south", "east", "west") if d not in MAZE.open_ways(MAZE.start))
    env, results = play([[move(blocked)]] * 3)
    assert (env.walker.at, env.walker.bumps, [r.reward for r in results]) == (MAZE.start, 3, [0.0] * 3)


def test_out_of_turns_is_truncated_with_nothing() -> None:
    shaped = RewardWeights(outcome=0.8, tool_use=0.2)
    _, results = play([[look()]] * 12, weights=shaped)
    last = results[-1]
    assert (last.terminated, last.truncated, last.reward, last.info["correct"]) == (
        False,
        True,
        pytest.approx(0.2),
        0.0,
    )


def test_moves_after_the_end_are_a_harness_error() -> None:
    env = FACTORY.make(TASK)

    async def go() -> None:
        await env.reset()
        for d in PATH:
            result = await env.step([move(d)])
        assert result.reward == 1.0
        with pytest.raises(RuntimeError, match="after the episode ended"):
            await env.step([move(PATH[-1])])

    asyncio.run(go())
