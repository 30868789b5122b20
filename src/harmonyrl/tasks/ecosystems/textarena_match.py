"""One two-player TextArena game, stepped seat by seat, with nothing asynchronous in it.

Both the live episodes (:mod:`.textarena_seats`, where the seats are played by concurrent episodes) and the scripted
demonstrations (:mod:`.textarena_duel`, which must reproduce what those episodes will see token for token) step the
game through this one class, so the two cannot drift apart.

What a seat sees: TextArena's default ``LLMObservationWrapper`` keeps one growing observation string per player, and
a seat is shown only the part it has not seen yet (the opponent's move, the new board), like the single-player
adapter; a wrapper whose observation is written afresh each turn (the ``-train`` variants'
``GameMessagesAndCurrentBoardObservationWrapper``: the prompt, the game's messages, the current board) is shown from
the first line that differs from what the seat saw last (the new messages and the board). That wrapper leaves out
TextArena's admin messages, the invalid-move warning among them: in a ``-train`` variant an invalid move shows the
same board again (``(no new observation)``), as the game's own wrapper decides.

The outcome is the game's own (``close()``: 1 win, 0 draw, −1 loss). An invalid move is judged by TextArena's rules
(``TwoPlayerState``: the first invalid move is a warning the same seat reads and moves again after, the second in a
row loses the game for that seat). A seat that leaves an unfinished game (its episode ended without a move: a
``final`` message, a malformed turn, out of turns or tokens) forfeits it under the same rule: a loss for it, a win
for the other.
"""

from __future__ import annotations

import random
import re
from typing import Any

from harmonyrl.envs.loader import UserCodeError
from harmonyrl.tasks.ecosystems.textarena import make_game

SEATS = 2
"""Two-player games only (``TwoPlayerState``); more seats would need a forfeit rule per game."""
_MOVE_LIST = re.compile(r"(available|valid|legal) (moves|actions)", re.IGNORECASE)
_BRACKETED = re.compile(r"\[[^\[\]\n]{1,40}\]")


def unseen(before: str, text: str) -> str:
    """What of ``text`` a reader of ``before`` has not seen: its tail if it extends ``before``, else its lines from
    the first one that differs (an observation written afresh each turn)."""
    if text.startswith(before):
        return text[len(before) :]
    old, new = before.splitlines(keepends=True), text.splitlines(keepends=True)
    same = 0
    while same < min(len(old), len(new)) and old[same] == new[same]:
        same += 1
    return "".join(new[same:])


def listed_moves(observation: str) -> list[str]:
    """The moves the game lists in its latest "Available Moves: '[0]', '[4]'…" line (empty if it lists none)."""
    for line in reversed(observation.splitlines()):
        if _MOVE_LIST.search(line):
            return list(dict.fromkeys(_BRACKETED.findall(line)))
    return []


def random_move(observation: str, rng: random.Random) -> str:
    """A move drawn uniformly from the listed ones: the ``random`` opponent (TextArena 0.7.4 ships no scripted
    or random agent, only API-backed ones)."""
    moves = listed_moves(observation)
    return rng.choice(moves) if moves else "[?]"


class Match:
    """One game of ``game`` at ``seed`` for two seats (see the module docstring)."""

    def __init__(self, game: str, seed: int) -> None:
        self.game = game
        self.env: Any = make_game(game)
        try:
            self.env.reset(num_players=SEATS, seed=seed)
        except Exception as e:
            detail = " ".join(str(e).split())[:120]
            raise UserCodeError(
                f"env.game '{game}' is not a one- or two-player game ({type(e).__name__}: {detail}): "
                "games of three or more players are not supported"
            ) from None
        self._shown = [""] * SEATS
        self.rewards: dict[int, float] | None = None
        """Each seat's TextArena reward once the game is over."""
        self.reason = ""
        self.forfeit: int | None = None
        """The seat that left the game unfinished, if one did."""
        self.invalid = [0] * SEATS
        """Invalid moves per seat (the game's warnings)."""

    @property
    def over(self) -> bool:
        return self.rewards is not None

    @property
    def current(self) -> int:
        """The seat to move."""
        return int(self.env.state.current_player_id)

    def observation(self, seat: int) -> str:
        """``seat``'s whole observation so far (it must be the seat to move)."""
        player, text = self.env.get_observation()
        if int(player) != seat:
            raise RuntimeError(f"seat {seat} asked for its observation on seat {player}'s turn")
        return str(text)

    def news(self, seat: int) -> str:
        """What ``seat`` has not been shown yet (it must be the seat to move)."""
        text = self.observation(seat)
        new, self._shown[seat] = unseen(self._shown[seat], text), text
        return new.strip() or "(no new observation)"

    def step(self, seat: int, action: str) -> None:
        """``seat`` moves ``action`` (the game's own parsing and rules); ends the match if the game ended.
        Whatever the game raises propagates: the caller decides it is an environment fault."""
        if self.over or seat != self.current:
            raise RuntimeError(f"seat {seat} moved out of turn (seat {self.current} to move, over={self.over})")
        errors = int(getattr(self.env.state, "error_count", 0))
        done, _ = self.env.step(action=action)
        if int(getattr(self.env.state, "error_count", 0)) > errors or (
            done and self.env.state.game_info[seat].get("invalid_move")
        ):
            self.invalid[seat] += 1
        if done:
            rewards, info = self.env.close()
            self.rewards = {int(k): float(v) for k, v in dict(rewards).items()}
            self.reason = str(dict(info).get(seat, {}).get("reason", ""))

    def leave(self, seat: int) -> None:
        """``seat`` leaves: an unfinished game is forfeited (TextArena's rule for a seat that cannot move: a loss)."""
        if self.over:
            return
        self.forfeit = seat
        self.rewards = {s: (-1.0 if s == seat else 1.0) for s in range(SEATS)}
        self.reason = f"Player {seat} left the game without finishing it."

    def outcome(self, seat: int) -> float:
        """``seat``'s TextArena reward: 1 win, 0 draw, −1 loss (the game must be over)."""
        assert self.rewards is not None
        return self.rewards.get(seat, 0.0)

    def verdict(self, seat: int) -> str:
        """The tool's last word to ``seat``: who won and why."""
        r = self.outcome(seat)
        word = "you won" if r > 0 else "you lost" if r < 0 else "a draw"
        return f"The game is over: {word} ({self.reason.strip() or 'no reason given'})."
