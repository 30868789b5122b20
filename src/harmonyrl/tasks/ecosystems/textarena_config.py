"""The ``env`` config of ``env.name=textarena`` (docs/textarena.md): which TextArena game, who plays the other seat of
a two-player one, and how many seeds per split. Reading it imports no environment; the game is made (and refused in
one line if it cannot run here) when the factory is built, before any compute."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import Field, field_validator

from harmonyrl.envs.loader import UserCodeError
from harmonyrl.frozen import Frozen
from harmonyrl.tasks.ecosystems.packages import same_version, version_of

if TYPE_CHECKING:
    from harmonyrl.envs.base import EnvFactory
    from harmonyrl.tasks.custom import Expert

DISTRIBUTION = "textarena"
NO_EXPERT = (
    "env.name=textarena has no scripted expert for a single-player game (TextArena ships no demonstrations): give "
    "sft.expert=module:fn, sft.demos=FILE, or sft.steps=0 with model.init_from"
)
OPPONENTS = "self (one shared policy on both seats) or random (a fixed opponent)"


class TextArenaEnvConfig(Frozen):
    """A TextArena game, moved with a ``move`` tool: a single-player one, or a two-player one against ``opponent``
    (docs/textarena.md; needs ``pip install 'harmonyrl[textarena]'``)."""

    name: Literal["textarena"] = "textarena"
    game: str = Field("GuessTheNumber-v0", min_length=1)
    """The TextArena game id, e.g. ``GuessTheNumber-v0``, ``TowerOfHanoi-v0`` (one player), ``TicTacToe-v0`` (two)."""
    opponent: str | None = None
    """Who plays a two-player game's other seat: ``self`` (self-play, both seats trained) or ``random`` (a fixed
    opponent drawing among the moves the game lists); required for a two-player game, refused for a one-player one."""
    n_train: int = Field(2000, ge=1)
    """Training seeds."""
    n_val: int = Field(200, ge=0)
    """Validation seeds (settings are chosen there)."""
    n_test: int = Field(200, ge=1)
    """Held-out test seeds."""
    memory: bool = False
    """Add the ``remember`` / ``recall`` notes tools (:mod:`harmonyrl.envs.memory`) to every episode."""
    package_version: str = Field(default_factory=lambda: version_of(DISTRIBUTION))
    """The TextArena version the run was made with (recorded; another installed version is an error)."""

    def build_factory(self, seed: int) -> EnvFactory:
        """Seeds of ``game`` (a game draws its own state from its seed; the run's ``seed`` is not used); the game is
        made here, so one that cannot run (unknown, needs a download, three players, no opponent) stops the run in
        one line before any compute."""
        from harmonyrl.tasks.ecosystems.textarena import TextArenaFactory, players
        from harmonyrl.tasks.ecosystems.textarena_duel import DuelFactory, SelfPlayFactory

        sizes = {"n_train": self.n_train, "n_val": self.n_val, "n_test": self.n_test}
        if players(self.game) == 1:
            if self.opponent is not None:
                raise UserCodeError(f"env.opponent: env.game '{self.game}' is a one-player game; leave it unset")
            return TextArenaFactory(game=self.game, **sizes)
        if self.opponent is None:
            raise UserCodeError(f"env.game '{self.game}' is a two-player game: set env.opponent to {OPPONENTS}")
        if self.opponent == "self":
            return SelfPlayFactory(game=self.game, **sizes)
        if self.opponent == "random":
            return DuelFactory(game=self.game, opponent=self.opponent, **sizes)
        if "/" in self.opponent or Path(self.opponent).exists():  # meant as a checkpoint folder
            if not Path(self.opponent).is_dir():
                raise UserCodeError(f"env.opponent '{self.opponent}': no such checkpoint folder")
            raise UserCodeError(
                f"env.opponent '{self.opponent}': a checkpoint as the fixed opponent is not supported yet "
                f"(docs/textarena.md); give {OPPONENTS}"
            )
        raise UserCodeError(f"env.opponent '{self.opponent}' is not an opponent: give {OPPONENTS}")

    def build_expert(self) -> Expert:
        """A two-player game: uniformly random listed moves on the task's seat against the random opponent (its
        own policy: the warm start learns the format, not strategy; in self-play the warm start asks the team for
        each seat's expert instead, this one serves ``sft --export-demos``). A one-player game: the one-line error
        that there is none."""
        if self.opponent in ("random", "self"):
            from harmonyrl.tasks.ecosystems.textarena_duel import DuelFactory

            return DuelFactory(game=self.game, n_train=1, n_val=0, n_test=1).expert
        raise UserCodeError(NO_EXPERT)

    @field_validator("package_version")
    @classmethod
    def _same_version(cls, recorded: str) -> str:
        return same_version(recorded, "textarena", DISTRIBUTION, "textarena")
