"""A two-player TextArena game as a harmonyrl environment: against a fixed opponent, or in self-play.

``env.name=textarena env.game=TicTacToe-v0 env.opponent=random``: one episode per game; the policy plays the
task's seat (seed parity: half the games it moves first, half second), the ``random`` opponent the other
(:func:`~.textarena_match.random_move`, drawn from the moves the game lists). A single-agent env whose episodes are
tagged with their seat by their task (:class:`~harmonyrl.envs.team.SeatTagged`), so each seat gets its win / draw /
loss rates.

``env.opponent=<checkpoint folder>``: a fixed earlier policy on the other seat, playing it as an episode of its own
(:class:`PlayerSeat`; the run builds the player, :mod:`harmonyrl.run.opponent`): it sees what a policy seat sees, so a
checkpoint trained on the game plays as it learned to. Only the policy's seat is trained.

``env.opponent=self``: one shared policy on both seats (:class:`~harmonyrl.envs.team.SeatedTeam`): each game is two
episodes played at once (:mod:`harmonyrl.rollout.seats`), each seat's turns its own trajectory and its own outcome,
trained like a team's roles.

Tasks are seeds, split by a hash of (game, seed) (:mod:`.splits`); a game draws its own state from the seed (TicTacToe
has none), the random opponent its moves. The scripted expert (the SFT warm start) plays the random opponent's
policy too — uniformly among the listed moves — so the warm start knows the format and the legal moves but no
strategy: winning more than chance is RL's to learn.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
from collections.abc import Sequence

from harmonyrl.envs.base import EnvFactory
from harmonyrl.envs.loader import UserCodeError
from harmonyrl.envs.team import RoleExpert
from harmonyrl.envs.tools import observation
from harmonyrl.tasks.ecosystems.splits import three_way_split
from harmonyrl.tasks.ecosystems.textarena_match import SEATS, Match, listed_moves, random_move
from harmonyrl.tasks.ecosystems.textarena_seats import Opponent, SeatEnv, SeatPlayer, Table
from harmonyrl.types import Message, Split, StepResult, Task, ToolSpec

ROLES = tuple(f"seat{i}" for i in range(SEATS))
ROLE_TERMS = ("win", "draw", "loss", "invalid_moves", "format_error", "moves", "opponent_forfeit")
"""Reward terms averaged per seat into the metrics (``team/seat0/win`` …)."""
_TASK = re.compile(r" seed (\d+), seat (\d+)$")


def random_opponent(seed: int) -> Opponent:
    """The ``random`` opponent of the game at ``seed``: its own generator, so a game replays move for move."""
    rng = random.Random(f"opponent:{seed}")

    async def act(seen: str) -> str:
        return random_move(seen, rng)

    return act


def check_playable(game: str) -> None:
    """Refuse, in one line, a game whose opening lists no moves (the random opponent and the expert need them)."""
    match = Match(game, 0)
    if not listed_moves(match.observation(match.current)):
        raise UserCodeError(
            f"env.game '{game}' lists no moves in its observation ('Available Moves: …'): the random opponent "
            "and the scripted expert cannot play it; use env.opponent=self with sft.steps=0 and model.init_from"
        )


def seed_and_seat(task: Task) -> tuple[int, int]:
    """The game's seed and the policy's seat, read back from the task's prompt."""
    found = _TASK.search(task.prompt)
    if found is None:
        raise UserCodeError(f"task '{task.id}' is not a TextArena two-player task ('{task.prompt}')")
    return int(found.group(1)), int(found.group(2))


def seeded_tasks(game: str, n_train: int, n_val: int, n_test: int) -> dict[Split, tuple[Task, ...]]:
    """Seeds in three disjoint splits; seed ``s`` plays seat ``s % 2``."""
    want: dict[Split, int] = {"train": n_train, "validation": n_val, "test": n_test}
    out: dict[Split, list[Task]] = {"train": [], "validation": [], "test": []}
    seed = 0
    while any(len(out[s]) < want[s] for s in out):
        split = three_way_split(f"{game}:{seed}")
        if len(out[split]) < want[split]:
            prompt = f"{game} seed {seed}, seat {seed % SEATS}"
            out[split].append(Task(f"ta-{game}-{split}-{len(out[split]):05d}", prompt, "", split))
        seed += 1
    return {s: tuple(v) for s, v in out.items()}


def seat_env(task: Task, game: str, seat: int) -> SeatEnv:
    """``seat`` of the game at the task's seed, the other seat played by the random opponent."""
    seed, _ = seed_and_seat(task)
    others = {s: random_opponent(seed) for s in range(SEATS) if s != seat}
    return SeatEnv(task, Table(Match(game, seed), others), seat)


def player_seed(seed: int) -> int:
    """The sampling seed of a checkpoint opponent in the game at ``seed`` (a game replays move for move)."""
    return random.Random(f"player:{seed}").getrandbits(31)


PLAYER_GRACE_S = 60.0
"""How long closing a seat waits for the opponent's episode to end once the game is over (it has one turn left to
read its verdict, if that); past it the opponent's episode is cancelled."""


class PlayerSeat:
    """The policy's seat of a game whose other seat a :data:`~.textarena_seats.SeatPlayer` plays as its own episode,
    at one table: resetting it starts the opponent's episode beside it, closing it ends both. The opponent's seat
    closes when its episode ends (one that ends with the game unfinished forfeits it, as a policy seat does); a player
    that raises makes the game an environment fault for the policy (the class and message are the fault's)."""

    def __init__(self, task: Task, game: str, seat: int, player: SeatPlayer | None) -> None:
        seed, _ = seed_and_seat(task)
        self.table = Table(Match(game, seed), {})
        self._mine, self._theirs = SeatEnv(task, self.table, seat), SeatEnv(task, self.table, 1 - seat)
        self._player, self._seed = player, player_seed(seed)
        self._playing: asyncio.Task[None] | None = None

    @property
    def tools(self) -> Sequence[ToolSpec]:
        return self._mine.tools

    @property
    def instructions(self) -> str:
        return self._mine.instructions

    async def _play(self) -> None:
        assert self._player is not None
        try:
            await self._player(self._theirs, self._seed)
        except Exception as e:  # the opponent's engine or harness: never the policy's doing
            await self.table.fail(f"the opponent raised {type(e).__name__}: {' '.join(str(e).split())[:200]}")
        finally:
            await self._theirs.close()

    async def reset(self) -> list[Message]:
        if self._player is None:  # a factory that only lists tasks and tools (a Ray driver's, a benchmark's)
            raise RuntimeError("env.opponent=<checkpoint>: no player to play it (the run builds one: run/setup.py)")
        if self._playing is None:
            self._playing = asyncio.create_task(self._play())
        return await self._mine.reset()

    async def step(self, action: Sequence[Message]) -> StepResult:
        return await self._mine.step(action)

    async def close(self) -> None:
        await self._mine.close()  # the game is over now (a forfeit if unfinished), which wakes the opponent
        if self._playing is not None and not self._playing.done():
            try:
                await asyncio.wait_for(asyncio.shield(self._playing), PLAYER_GRACE_S)
            except TimeoutError:
                self._playing.cancel()


def expert_demo(task: Task, rng: random.Random, game: str, seat: int) -> list[Message]:
    """``seat``'s demonstration against the random opponent: uniformly random listed moves, each result exactly what
    :class:`~.textarena_seats.Table` returns (the same :class:`Match` steps, in the same order); it ends on the
    game-ending move, as the episode does."""
    seed, _ = seed_and_seat(task)
    match, opponent = Match(game, seed), random.Random(f"opponent:{seed}")
    demo: list[Message] = []

    def opponents_move() -> str:
        while not match.over and match.current != seat:
            match.step(match.current, random_move(match.observation(match.current), opponent))
        return "" if match.over else match.news(seat)

    seen = opponents_move()  # the opening the env's reset shows
    while not match.over:
        action = random_move(seen, rng)
        args = json.dumps({"action": action})
        demo.append(Message("assistant", args, channel="commentary", recipient="functions.move", content_type="json"))
        match.step(seat, action)
        seen = opponents_move()
        if not match.over:
            demo.append(observation("move", seen))
    return demo


class DuelFactory:
    """A two-player game against a fixed opponent: one episode per game, the policy on the task's seat."""

    name = "textarena"
    roles: tuple[str, ...] = ROLES
    role_terms: tuple[str, ...] = ROLE_TERMS

    def __init__(
        self,
        game: str,
        opponent: str = "random",
        n_train: int = 2000,
        n_val: int = 200,
        n_test: int = 200,
        player: SeatPlayer | None = None,
    ) -> None:
        check_playable(game)
        self.game = game
        self.opponent = opponent
        """``random``, or a checkpoint folder whose ``player`` the run built (:mod:`harmonyrl.run.opponent`)."""
        self._player = player
        self._splits = seeded_tasks(game, n_train, n_val, n_test)
        self._seats = {t.id: seed_and_seat(t)[1] for split in self._splits.values() for t in split}

    def tasks(self, split: Split) -> Sequence[Task]:
        return self._splits[split]

    def make(self, task: Task) -> SeatEnv | PlayerSeat:
        seat = seed_and_seat(task)[1]
        if self.opponent == "random":
            return seat_env(task, self.game, seat)
        return PlayerSeat(task, self.game, seat, self._player)

    def role_of(self, task_id: str) -> int | None:
        """The seat the policy plays in the task's game (per-seat metrics)."""
        return self._seats.get(task_id)

    def expert(self, task: Task, rng: random.Random) -> list[Message]:
        """The scripted expert on the task's seat (module docstring)."""
        return expert_demo(task, rng, self.game, seed_and_seat(task)[1])


class _SeatAlone:
    """Seat ``seat`` against the random opponent: a self-play team's per-role factory (SFT demos, check-env)."""

    def __init__(self, team: SelfPlayFactory, seat: int) -> None:
        self.name = f"textarena.{ROLES[seat]}"
        self._team, self._seat = team, seat

    def tasks(self, split: Split) -> Sequence[Task]:
        return self._team.tasks(split)

    def make(self, task: Task) -> SeatEnv:
        return seat_env(task, self._team.game, self._seat)


class _SeatAtTable:
    """Seat ``seat`` at one shared table: ``make`` is called once, for the one game of one request."""

    def __init__(self, name: str, table: Table, seat: int) -> None:
        self.name, self._table, self._seat = name, table, seat

    def tasks(self, split: Split) -> Sequence[Task]:
        raise RuntimeError("a seat at a table plays one game; its tasks are the team's")

    def make(self, task: Task) -> SeatEnv:
        return SeatEnv(task, self._table, self._seat)


class SelfPlayFactory:
    """A two-player game in self-play: one shared policy on both seats (a :class:`~harmonyrl.envs.team.SeatedTeam`)."""

    name = "textarena"
    roles: tuple[str, ...] = ROLES
    role_terms: tuple[str, ...] = ROLE_TERMS

    def __init__(self, game: str, n_train: int = 2000, n_val: int = 200, n_test: int = 200) -> None:
        check_playable(game)
        self.game = game
        self._splits = seeded_tasks(game, n_train, n_val, n_test)

    def tasks(self, split: Split) -> Sequence[Task]:
        return self._splits[split]

    def make(self, task: Task) -> SeatEnv:
        """Seat 0 against the random opponent: what ``check-env`` and the prompt-fit check read."""
        return seat_env(task, self.game, 0)

    def role_factory(self, role: int) -> EnvFactory:
        return _SeatAlone(self, role)

    def role_expert(self, role: int) -> RoleExpert:
        return lambda task, rng: expert_demo(task, rng, self.game, role)

    def table(self, task: Task) -> Sequence[EnvFactory]:
        """One fresh game at the task's seed, no fixed opponent: both seats are the policy's episodes."""
        table = Table(Match(self.game, seed_and_seat(task)[0]), {})
        return [_SeatAtTable(f"textarena.{ROLES[s]}", table, s) for s in range(SEATS)]
