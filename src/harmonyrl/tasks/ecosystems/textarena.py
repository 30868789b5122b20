"""TextArena (PyPI ``textarena``): a single-player TextArena game as a harmonyrl environment (two-player games:
:mod:`.textarena_duel`).

``env.name=textarena env.game=GuessTheNumber-v0``

What is mapped to what:

* **tasks**: a task is one seed of the game (``ta.make(game)``, with the game's own default wrappers, then
  ``reset(num_players=1, seed=s)``); its split is a hash of (game, seed) (:mod:`.splits`); the prompt is the
  game's opening observation.
* **moves**: the policy moves with one function tool, ``move(action)``: the text goes to ``env.step(action)``
  unchanged (the game's own parsing and wrappers decide what it means; an invalid move is the game's business,
  usually a penalty it reports), and the game's new text (the growing observation string of TextArena's
  ``LLMObservationWrapper``, only the part not shown yet) comes back as the tool's result. A tool call, not a
  ``final`` message per move: harmony ends a turn after ``final`` with ``<|return|>``, which a later turn's prompt
  would re-render as ``<|end|>``; tool turns keep the ids token-exact.
* **reward**: when the game ends, ``env.close()`` gives player 0's reward (TextArena: 1 win, 0 draw, -1 loss, some
  single-player games a fraction); harmonyrl's reward is ``(r + 1) / 2`` clamped to [0, 1], ``correct`` a win
  (``r >= 1``). A ``final`` message ends the episode with the game unfinished: reward 0, ``format_error``.
* **faults**: the game raising in ``step`` is an environment fault (the episode is masked); a move the game
  refuses is its own observation.

Refused in one line: a game TextArena does not have, a game that needs data downloaded at run time (nltk corpora:
``Wordle``, ``Hangman``, ``WordLadder``…) or whose module does not import here; a two-player game goes to
:mod:`.textarena_duel` (``env.opponent``), a game of three or more players is refused (:mod:`.textarena_match`).
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Sequence
from typing import Any

from harmonyrl.envs.loader import UserCodeError
from harmonyrl.envs.tools import Tool, Toolbox, ToolInfraError
from harmonyrl.envs.turns import ToolTurns
from harmonyrl.tasks.ecosystems.packages import require, version_of
from harmonyrl.tasks.ecosystems.splits import three_way_split
from harmonyrl.types import Message, Split, StepResult, Task, ToolSpec

INSTRUCTIONS = "Play the game. Make each move by calling the move tool with your move as the game asks for it."


def make_game(game: str) -> Any:
    """``ta.make(game)`` with the game's default wrappers; refusals in one line (:class:`UserCodeError`)."""
    require("textarena", "textarena", "textarena")
    import textarena as ta
    from textarena.envs.registration import ENV_REGISTRY

    if game not in ENV_REGISTRY:
        version = version_of("textarena")
        raise UserCodeError(f"env.game '{game}' is not a TextArena {version} game (e.g. GuessTheNumber-v0)")
    quiet = io.StringIO()
    try:
        with contextlib.redirect_stderr(quiet), contextlib.redirect_stdout(quiet):
            return ta.make(game)
    except LookupError as e:
        missing = str(e).split("Resource")[1].split("not found")[0].strip(" '\n*") if "Resource" in str(e) else "data"
        raise UserCodeError(f"env.game '{game}' needs data downloaded at run time (nltk {missing}): refused") from None
    except Exception as e:  # the game's own module failing to import or build (Chess-v0: a SyntaxError on 3.11)
        reason = " ".join(str(e).split())[:160]
        raise UserCodeError(f"env.game '{game}': TextArena could not make it ({type(e).__name__}: {reason})") from None


def opening(env: Any, seed: int, game: str) -> str:
    """Reset ``env`` for one player at ``seed``; the opening observation."""
    env.reset(num_players=1, seed=seed)
    _, observation = env.get_observation()
    return str(observation)


def players(game: str) -> int:
    """1 if ``game`` resets for one player, else 2 (a game that takes neither is refused when its match is made:
    :mod:`.textarena_match`)."""
    try:
        opening(make_game(game), 0, game)
    except UserCodeError:
        raise
    except Exception:
        return 2
    return 1


class TextArenaEnv:
    """One game of ``game`` at ``seed``, moved with the ``move`` tool (module docstring)."""

    def __init__(self, task: Task, game: str, seed: int) -> None:
        self.task, self._game, self._seed = task, game, seed
        self._env: Any = None
        self._shown = 0
        self.result: float | None = None
        """Player 0's TextArena reward once the game ended."""
        self._episode = ToolTurns(Toolbox([Tool.from_function(self.move, timeout_s=10.0)]))

    @property
    def tools(self) -> Sequence[ToolSpec]:
        return self._episode.toolbox.specs

    @property
    def instructions(self) -> str:
        return INSTRUCTIONS

    async def reset(self) -> list[Message]:
        self._episode.reset()
        self._env = make_game(self._game)
        text = opening(self._env, self._seed, self._game)
        self._shown, self.result = len(text), None
        return [Message(role="user", content=text)]

    def move(self, action: str) -> str:
        """Make one move in the game.

        Args:
            action: The move, in the form the game asks for (e.g. [12]).
        """
        if self.result is not None:
            return "The game is over."
        try:
            done, _ = self._env.step(action=action)
        except Exception as e:  # the game's own code failing says nothing about the model
            raise ToolInfraError(f"{self._game} step raised {type(e).__name__}: {e}") from None
        if done:
            rewards = self._env.close()
            self.result = float(rewards[0]) if isinstance(rewards, dict) else float(rewards[0][0])
            return f"The game is over (reward {self.result:g})."
        _, observation = self._env.get_observation()
        text = str(observation)
        new, self._shown = text[self._shown :], len(text)
        return new.strip() or "(no new observation)"

    async def step(self, action: Sequence[Message]) -> StepResult:
        turn = await self._episode.step(action)
        if turn is not None and self.result is None:
            return turn
        result = 0.0 if self.result is None else self.result
        info = {
            "correct": float(result >= 1.0),
            "game_reward": result,
            "format_error": float(self.result is None),
            "moves": float(self._episode.tool_calls),
        }
        reward = 0.0 if self.result is None else min(1.0, max(0.0, (result + 1.0) / 2.0))
        return StepResult(reward=reward, terminated=True, info=info)

    async def close(self) -> None:
        self._episode.done = True


class TextArenaFactory:
    """Seeds of one single-player game in disjoint splits; one :class:`TextArenaEnv` per episode."""

    name = "textarena"

    def __init__(self, game: str, n_train: int = 2000, n_val: int = 200, n_test: int = 200) -> None:
        self.game = game
        if players(game) != 1:
            raise UserCodeError(f"env.game '{game}' is not a single-player game: give env.opponent (docs/textarena.md)")
        want: dict[Split, int] = {"train": n_train, "validation": n_val, "test": n_test}
        out: dict[Split, list[Task]] = {"train": [], "validation": [], "test": []}
        self._seeds: dict[str, int] = {}
        seed = 0
        while any(len(out[s]) < want[s] for s in out):
            split = three_way_split(f"{game}:{seed}")
            if len(out[split]) < want[split]:
                task_id = f"ta-{game}-{split}-{len(out[split]):05d}"
                out[split].append(Task(task_id, f"{game} seed {seed}", "", split))
                self._seeds[task_id] = seed
            seed += 1
        self._splits = {s: tuple(v) for s, v in out.items()}

    def tasks(self, split: Split) -> Sequence[Task]:
        return self._splits[split]

    def make(self, task: Task) -> TextArenaEnv:
        return TextArenaEnv(task, self.game, self._seeds[task.id])
