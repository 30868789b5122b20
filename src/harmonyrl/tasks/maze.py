"""Maze: a stateful, long-horizon game. Find the exit of a hidden grid maze with ``look`` and ``move``.

    factory = MazeFactory(seed=0, size=4)
    env = factory.make(factory.tasks("train")[0])
    # prompt: "Maze 3f9c0a1b2d (4x4). You are at row 0, column 2. Reach the exit at row 3, column 1. ..."
    # move {"direction": "south"} -> {"at": [1, 2], "open": ["north", "west"]}

The model never sees the map: ``look()`` reports the position and the open directions, ``move`` walks one room
and reports the same for the new room. Bumping into a wall is the model's mistake, so it is an observation
(``{"blocked": "south", ...}``), never a failure. Each call is one turn and costs ~60 tokens with the shipped
tokenizer, so raise ``rollout.max_turns`` to the env's ``max_turns`` and ``rollout.max_seq_len`` well past the
default 512: the expert's demonstrations (p_tool 0.8, p_verbose 0.3) measure 813 tokens median / 1329 at the
95th percentile for 3x3 mazes, and 1061 / 1855 for 4x4.

Episode end: a ``move`` onto the exit terminates with outcome 1; a ``final`` message (giving up) terminates
with outcome 0; after ``max_turns`` turns the episode is *truncated* (a time limit, not a task end). The
terminal reward is :func:`~harmonyrl.envs.reward.compose_reward` of ``outcome``, ``format`` (every call
was a well-formed call to a known tool, and the player did not give up), ``tool_use`` (at least one tool ran)
and ``step_cost`` (minus the turns): with ``env.reward.step_cost=0.02`` a shorter walk to the exit earns more.

Mazes are perfect mazes (randomised depth-first carving) with ``size // 2`` extra openings, so there are
loops and a wrong turn can be undone more than one way. A maze is its map (``#`` walls, ``.`` rooms and
passages, ``S`` start, ``G`` exit), kept in ``Task.answer`` — the env's ground truth, which the model never
sees — so the env and the expert rebuild it from the task alone. The canonical key is the map reduced over the
8 symmetries of the square: a rotated or mirrored copy of a held-out maze cannot appear in train.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from harmonyrl.envs.reward import OUTCOME_ONLY, RewardWeights, compose_reward
from harmonyrl.envs.taskfile import draw_three
from harmonyrl.envs.tools import Tool, Toolbox, observation
from harmonyrl.types import Message, Split, StepResult, Task, ToolSpec

Direction = Literal["north", "south", "east", "west"]
DIRECTIONS: tuple[Direction, ...] = get_args(Direction)
STEP: dict[Direction, tuple[int, int]] = {"north": (-1, 0), "south": (1, 0), "east": (0, 1), "west": (0, -1)}
INSTRUCTIONS = (
    "Find the exit of the maze. Call look to see where you are and which ways are open, then move one room at "
    "a time. Row 0 is the north edge and column 0 the west edge. Reaching the exit ends the game."
)
Cell = tuple[int, int]
DEMO_TURNS = 40
"""The expert's turn budget: the default ``max_turns``, so no demonstration shows turns the env would cut."""


@dataclass(frozen=True)
class Maze:
    """A square maze of ``size`` x ``size`` rooms; ``grid`` is its (2 size + 1)-square character map."""

    grid: tuple[str, ...]
    start: Cell
    goal: Cell

    @property
    def size(self) -> int:
        return len(self.grid) // 2

    @classmethod
    def parse(cls, text: str) -> Maze:
        """The maze of a map (``Task.answer``); ``ValueError`` if it is not a well-formed map."""
        grid = tuple(text.split("\n"))
        n = len(grid)
        if n < 5 or n % 2 == 0 or any(len(row) != n or set(row) - set("#.SG") for row in grid):
            raise ValueError("a maze map is an odd square (>= 5) of '#', '.', 'S' and 'G' rows")
        if set(grid[0] + grid[-1] + "".join(row[0] + row[-1] for row in grid)) != {"#"}:
            raise ValueError("a maze map is closed: its border is all '#'")
        marks = {ch: (r, c) for r, row in enumerate(grid) for c, ch in enumerate(row) if ch in "SG"}
        if text.count("S") != 1 or text.count("G") != 1 or any(r % 2 == 0 or c % 2 == 0 for r, c in marks.values()):
            raise ValueError("a maze map has exactly one 'S' (start) and one 'G' (exit), each in a room")
        return cls(grid, (marks["S"][0] // 2, marks["S"][1] // 2), (marks["G"][0] // 2, marks["G"][1] // 2))

    @property
    def text(self) -> str:
        return "\n".join(self.grid)

    def open_ways(self, cell: Cell) -> list[Direction]:
        r, c = cell
        return [d for d, (dr, dc) in STEP.items() if self.grid[2 * r + 1 + dr][2 * c + 1 + dc] != "#"]

    def shortest_path(self, frm: Cell) -> list[Direction]:
        """The moves of a shortest walk from ``frm`` to the exit (breadth-first search, ties in DIRECTIONS order)."""
        came: dict[Cell, tuple[Cell, Direction] | None] = {frm: None}
        queue = deque([frm])
        while queue:
            cell = queue.popleft()
            if cell == self.goal:
                break
            for d in self.open_ways(cell):
                nxt = (cell[0] + STEP[d][0], cell[1] + STEP[d][1])
                if nxt not in came:
                    came[nxt] = (cell, d)
                    queue.append(nxt)
        path: list[Direction] = []
        cell = self.goal
        while (prev := came[cell]) is not None:
            cell, d = prev
            path.append(d)
        return path[::-1]


def generate_maze(size: int, r: random.Random) -> Maze:
    """Randomised depth-first carving, ``size // 2`` extra openings, start and exit >= ``size`` moves apart."""
    n = 2 * size + 1
    grid = [["#"] * n for _ in range(n)]
    stack, seen = [(r.randrange(size), r.randrange(size))], set()
    seen.add(stack[0])
    grid[2 * stack[0][0] + 1][2 * stack[0][1] + 1] = "."
    while stack:
        cr, cc = stack[-1]
        nxt = [(d, cr + dr, cc + dc) for d, (dr, dc) in STEP.items()
               if 0 <= cr + dr < size and 0 <= cc + dc < size and (cr + dr, cc + dc) not in seen]  # fmt: skip
        if not nxt:
            stack.pop()
            continue
        _, nr, nc = r.choice(nxt)
        grid[cr + nr + 1][cc + nc + 1] = grid[2 * nr + 1][2 * nc + 1] = "."
        seen.add((nr, nc))
        stack.append((nr, nc))
    walls = [(y, x) for y in range(1, n - 1) for x in range(1, n - 1) if grid[y][x] == "#" and (y % 2) != (x % 2)]
    for y, x in r.sample(walls, min(len(walls), size // 2)):
        grid[y][x] = "."
    rooms = [(i, j) for i in range(size) for j in range(size)]
    while True:
        start, goal = r.sample(rooms, 2)
        maze = Maze(tuple("".join(row) for row in grid), start, goal)
        if len(maze.shortest_path(start)) >= size:
            break
    for (i, j), mark in ((start, "S"), (goal, "G")):
        grid[2 * i + 1][2 * j + 1] = mark
    return Maze(tuple("".join(row) for row in grid), start, goal)


def canonical_key(maze: Maze) -> str:
    """The map's smallest text over the 8 rotations / reflections of the square."""
    rows = [list(row) for row in maze.grid]
    variants = []
    for _ in range(4):
        rows = [list(col) for col in zip(*rows[::-1], strict=True)]  # rotate 90 degrees
        variants += ["\n".join(map("".join, rows)), "\n".join("".join(row[::-1]) for row in rows)]
    return min(variants)


def _draw(size: int) -> Callable[[random.Random], tuple[str, Callable[[], tuple[str, str]]]]:
    def draw(r: random.Random) -> tuple[str, Callable[[], tuple[str, str]]]:
        maze = generate_maze(size, r)
        key = canonical_key(maze)

        def make() -> tuple[str, str]:
            tag = hashlib.sha256(maze.text.encode()).hexdigest()[:10]  # unique prompts for distinct mazes
            (sr, sc), (gr, gc) = maze.start, maze.goal
            prompt = (f"Maze {tag} ({size}x{size}). You are at row {sr}, column {sc}. "
                      f"Reach the exit at row {gr}, column {gc}.")  # fmt: skip
            return prompt, maze.text

        return key, make

    return draw


# ---- tools and the episode ---------------------------------------------------------------------------


def look() -> str:
    """Your position and the directions you can move in from here."""
    raise NotImplementedError("bound to an episode by MazeEnv")


def move(direction: Direction) -> str:
    """Walk one room in a direction; reports your new position and its open directions.

    Args:
        direction: One of "north", "south", "east", "west".
    """
    raise NotImplementedError("bound to an episode by MazeEnv")


LOOK, MOVE = Tool.from_function(look, timeout_s=2.0), Tool.from_function(move, timeout_s=2.0)
"""Declarations derived once; each episode binds them to its own state (:func:`dataclasses.replace`)."""


class Walker:
    """The game state and its rules, shared by the env and the expert so demos show the env's exact replies."""

    def __init__(self, maze: Maze) -> None:
        self.maze, self.at, self.moves, self.bumps = maze, maze.start, 0, 0

    def look(self) -> str:
        return json.dumps({"at": list(self.at), "open": self.maze.open_ways(self.at)})

    def move(self, direction: Direction) -> str:
        if direction not in self.maze.open_ways(self.at):
            self.bumps += 1
            return json.dumps({"blocked": direction, "at": list(self.at), "open": self.maze.open_ways(self.at)})
        self.moves += 1
        self.at = (self.at[0] + STEP[direction][0], self.at[1] + STEP[direction][1])
        if self.at == self.maze.goal:
            return json.dumps({"at": list(self.at), "exit": True})
        return self.look()


class MazeEnv:
    """One game. Intermediate steps earn 0; the terminal (or truncating) step carries the composed reward."""

    def __init__(self, task: Task, weights: RewardWeights, max_turns: int) -> None:
        self.task = task
        self.maze = Maze.parse(task.answer)
        self._weights, self._max_turns = weights, max_turns
        self._reset_state()

    def _reset_state(self) -> None:
        self.walker = Walker(self.maze)
        self._turns = self._invalid = self._tools_ran = 0
        self._done = False

        async def look_here() -> str:
            return self.walker.look()

        async def move_here(direction: Direction) -> str:
            return self.walker.move(direction)

        self._toolbox = Toolbox([dataclasses.replace(LOOK, fn=look_here), dataclasses.replace(MOVE, fn=move_here)])

    @property
    def tools(self) -> Sequence[ToolSpec]:
        return (LOOK.spec, MOVE.spec)

    @property
    def instructions(self) -> str:
        return INSTRUCTIONS

    async def reset(self) -> list[Message]:
        self._reset_state()
        return [Message(role="user", content=self.task.prompt)]

    async def step(self, action: Sequence[Message]) -> StepResult:
        if self._done:
            raise RuntimeError("step() called after the episode ended")
        self._turns += 1
        last = action[-1] if action else None
        if last is None or not self._toolbox.handles(last):  # a final answer, or no call: the player stops
            return self._end(terminated=True)
        dispatch = await self._toolbox.dispatch(last)
        if dispatch.failure is not None:  # cannot happen with in-memory tools, but never scored if it does
            self._done = True
            return StepResult(failure=dispatch.failure)
        self._invalid += dispatch.kind != "ok"
        self._tools_ran += dispatch.kind == "ok"
        if self.walker.at == self.maze.goal:
            return self._end(terminated=True)
        if self._turns >= self._max_turns:
            return self._end(terminated=False)
        assert dispatch.observation is not None
        return StepResult(observations=(dispatch.observation,), info={"tool_error": float(dispatch.kind != "ok")})

    def _end(self, terminated: bool) -> StepResult:
        self._done = True
        solved = self.walker.at == self.maze.goal
        terms = {
            "outcome": float(solved),
            # giving up is a stop, not a clean game: paying it would teach "look once, then quit" (seen in RL)
            "format": float(self._invalid == 0 and self._tools_ran > 0 and (solved or not terminated)),
            "tool_use": float(self._tools_ran > 0),
            "step_cost": -float(self._turns),
        }
        reward, parts = compose_reward(terms, self._weights.as_dict())
        info = {
            "correct": float(solved),
            "turns": float(self._turns),
            "moves": float(self.walker.moves),
            "bumps": float(self.walker.bumps),
            "invalid_calls": float(self._invalid),
            "shortest": float(len(self.maze.shortest_path(self.maze.start))),
            **parts,
        }
        return StepResult(reward=reward, terminated=terminated, truncated=not terminated, info=info)

    async def close(self) -> None:
        self._done = True


class MazeFactory:
    """Generated mazes of one size; train, validation and test are disjoint up to rotation and reflection
    (validation: ``n_val`` mazes drawn after train and test, :func:`~harmonyrl.envs.taskfile.draw_three`)."""

    name = "maze"

    def __init__(
        self,
        seed: int = 0,
        n_train: int = 2000,
        n_test: int = 100,
        size: int = 4,
        max_turns: int = 40,
        weights: RewardWeights = OUTCOME_ONLY,
        n_val: int = 0,
    ) -> None:
        if not 2 <= size <= 12 or max_turns < 1:
            raise ValueError("size must be in [2, 12] and max_turns >= 1")
        self.seed, self.size, self.max_turns, self.weights = seed, size, max_turns, weights
        self._splits = draw_three(self.name, seed, n_train, n_val, n_test, _draw(size))

    def tasks(self, split: Split) -> Sequence[Task]:
        return self._splits.of(split)

    def make(self, task: Task) -> MazeEnv:
        return MazeEnv(task, self.weights, self.max_turns)


def _call(name: str, args: dict[str, str]) -> Message:
    return Message("assistant", json.dumps(args), channel="commentary", recipient=f"functions.{name}",
                   content_type="json")  # fmt: skip


def expert_demo(task: Task, rng: random.Random, p_tool: float = 0.8, p_verbose: float = 0.0) -> list[Message]:
    """``look``, then shortest-path moves to the exit, replanned after every move (breadth-first search).

    Imperfections: each move is, with probability ``1 - p_tool``, a random other direction (a bump or a detour
    the expert then recovers from); with probability ``p_verbose`` a move is preceded by a needless ``look``.
    The walk stops after :data:`DEMO_TURNS` calls (the default ``max_turns``) even if the exit was not reached.
    """
    walker = Walker(Maze.parse(task.answer))
    demo = [_call("look", {}), observation("look", walker.look())]
    turns = 1
    while turns < DEMO_TURNS:
        if p_verbose > 0 and rng.random() < p_verbose:  # p_verbose 0 draws nothing: demo streams stay put
            demo += [_call("look", {}), observation("look", walker.look())]
            turns += 1
            continue
        best = walker.maze.shortest_path(walker.at)[0]
        step = best if rng.random() < p_tool else rng.choice([d for d in DIRECTIONS if d != best])
        demo.append(_call("move", {"direction": step}))
        turns += 1
        result = walker.move(step)
        if walker.at == walker.maze.goal:
            return demo  # the winning move ends the episode: no observation follows it
        demo.append(observation("move", result))
    return demo[:-1]  # out of turns: a demonstration ends with the assistant's own message
