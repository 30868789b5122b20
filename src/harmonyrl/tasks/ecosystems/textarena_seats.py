"""A two-player TextArena game at a table: each seat the policy plays is its own episode, moved with the ``move``
tool; a seat a fixed opponent plays is played inside the table.

How a seat's episode goes: ``reset`` waits for the seat's first turn and shows what it sees; each ``move`` call
plays the move, then waits — while the other seat (another episode of the same policy in self-play, or the fixed
opponent) takes its turn — and returns the news (the opponent's move, the new board). The episodes of one table must
therefore run at the same time: :mod:`harmonyrl.rollout.seats` runs them so. The last move's result is the verdict,
and the episode ends there with the seat's own outcome (zero-sum: a win for one seat is a loss for the other).

Who is to blame:

* an invalid move is the model's, judged by the game's rules (:mod:`.textarena_match`);
* a seat whose episode ends without finishing the game (a ``final`` message, a malformed turn, out of turns or
  tokens) forfeits it when its episode closes: a loss for it, a win for the other seat;
* the game raising in ``step`` is an environment fault (:class:`~harmonyrl.envs.tools.ToolInfraError`, with the
  exception's class) for every seat at the table: the outcome was never decided, so nobody scores 0 for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence

from harmonyrl.envs.base import Env
from harmonyrl.envs.tools import Tool, Toolbox, ToolInfraError
from harmonyrl.envs.turns import ToolTurns
from harmonyrl.tasks.ecosystems.textarena_match import Match
from harmonyrl.types import Message, StepResult, Task, ToolSpec

Opponent = Callable[[str], Awaitable[str]]
"""A fixed opponent played inside the table: the seat's whole observation so far in, its move out."""
SeatPlayer = Callable[[Env, int], Awaitable[None]]
"""A fixed policy that plays a seat as an episode of its own (a checkpoint: ``env.opponent=<folder>``): the seat's
env and a sampling seed in; it plays until the episode ends and leaves closing the env to its caller."""
INSTRUCTIONS = (
    "You are playing a two-player game. Make each move by calling the move tool with your move as the game asks "
    "for it; the result shows your opponent's reply. Keep moving until the game is over."
)
WAIT_S = 900.0
"""How long a ``move`` may wait for the other seat: a bound on a hung table, not on the model. It is a tool
timeout, so a table that outlives it is an environment fault; the episode's own wall-clock budget
(``rollout.episode_timeout_s``) usually ends it first."""


class Table:
    """One :class:`Match` shared by its seats' episodes; ``opponents`` are the seats played inside the table."""

    def __init__(self, match: Match, opponents: Mapping[int, Opponent]) -> None:
        self.match = match
        self._opponents = dict(opponents)
        self._cond = asyncio.Condition()
        self.crash: str | None = None
        """The game's exception (class: message), once it raised: every seat's episode is then a fault."""

    def _step(self, seat: int, action: str) -> None:
        try:
            self.match.step(seat, action)
        except Exception as e:  # the game's own code failing says nothing about the model
            self.crash = f"{self.match.game} step raised {type(e).__name__}: {' '.join(str(e).split())[:200]}"

    async def _opponents_move(self) -> None:
        """Play the fixed opponents' turns until a policy seat is to move (the lock is held)."""
        while not self.match.over and self.crash is None and self.match.current in self._opponents:
            seat = self.match.current
            self._step(seat, await self._opponents[seat](self.match.observation(seat)))

    async def fail(self, reason: str) -> None:
        """Something outside the game broke the table (a seat's player raised): every seat's episode is a fault."""
        async with self._cond:
            self.crash = self.crash or reason
            self._cond.notify_all()

    def _raise_crash(self) -> None:
        if self.crash is not None:
            raise ToolInfraError(self.crash)

    async def turn(self, seat: int) -> str:
        """Wait for ``seat``'s turn (or the end); what it has not been shown yet ("" once the game is over)."""
        async with self._cond:
            await self._opponents_move()
            self._cond.notify_all()
            await self._cond.wait_for(lambda: self.match.over or self.crash is not None or self.match.current == seat)
            self._raise_crash()
            return "" if self.match.over else self.match.news(seat)

    async def move(self, seat: int, action: str) -> str:
        """``seat`` moves, then waits for its next turn: the news, or the verdict once the game is over."""
        async with self._cond:
            self._raise_crash()
            self._step(seat, action)
            self._cond.notify_all()
            self._raise_crash()
        news = await self.turn(seat)
        return self.match.verdict(seat) if self.match.over else news

    async def leave(self, seat: int) -> None:
        """``seat``'s episode ended: an unfinished game is its forfeit; wake the seats waiting for it."""
        async with self._cond:
            if self.crash is None:
                self.match.leave(seat)
            self._cond.notify_all()


class SeatEnv:
    """One seat's episode at a :class:`Table` (see the module docstring)."""

    def __init__(self, task: Task, table: Table, seat: int) -> None:
        self.task, self.table, self.seat = task, table, seat
        self._episode = ToolTurns(Toolbox([Tool.from_function(self.move, timeout_s=WAIT_S)]))

    @property
    def tools(self) -> Sequence[ToolSpec]:
        return self._episode.toolbox.specs

    @property
    def instructions(self) -> str:
        return INSTRUCTIONS

    async def reset(self) -> list[Message]:
        self._episode.reset()
        text = await self.table.turn(self.seat)
        return [Message(role="user", content=text or self.table.match.verdict(self.seat))]

    async def move(self, action: str) -> str:
        """Make one move in the game; the result is your opponent's reply and the new board.

        Args:
            action: The move, in the form the game asks for (e.g. [4]).
        """
        if self.table.match.over:
            return "The game is over."
        return await self.table.move(self.seat, action)

    async def step(self, action: Sequence[Message]) -> StepResult:
        turn = await self._episode.step(action)
        match = self.table.match
        if turn is not None and not match.over:
            return turn
        if turn is not None and turn.failure is not None:
            return turn
        result = match.outcome(self.seat) if match.over else -1.0  # ending with the game unfinished: a forfeit
        info = {
            "correct": float(result > 0),
            "win": float(result > 0),
            "draw": float(result == 0),
            "loss": float(result < 0),
            "game_reward": result,
            "format_error": float(not match.over),
            "invalid_moves": float(match.invalid[self.seat]),
            "opponent_forfeit": float(match.forfeit is not None and match.forfeit != self.seat),
            "seat": float(self.seat),
            "moves": float(self._episode.tool_calls),
        }
        return StepResult(reward=(result + 1.0) / 2.0, terminated=True, info=info)

    async def close(self) -> None:
        self._episode.done = True
        await self.table.leave(self.seat)
