"""The ``env`` config of ``env.name=textarena`` (docs/textarena.md): which TextArena game, who plays the other seat of
a two-player one, and how many seeds per split. Reading it imports no environment; the game is made (and refused in
one line if it cannot run here) when the factory is built, before any compute."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import Field, field_validator, model_validator

from harmonyrl.envs.loader import UserCodeError
from harmonyrl.frozen import Frozen, checkpoint_folder
from harmonyrl.tasks.ecosystems.packages import same_version, version_of

if TYPE_CHECKING:
    from harmonyrl.envs.base import EnvFactory
    from harmonyrl.tasks.custom import Expert
    from harmonyrl.tasks.ecosystems.textarena_seats import SeatPlayer

DISTRIBUTION = "textarena"
NO_EXPERT = (
    "env.name=textarena has no scripted expert for a single-player game (TextArena ships no demonstrations): give "
    "sft.expert=module:fn, sft.demos=FILE, or sft.steps=0 with model.init_from"
)
OPPONENTS = "self (one shared policy on both seats), random (a fixed opponent) or a checkpoint folder (a fixed policy)"


def checkpoint_named(opponent: str | None) -> Path | None:
    """The folder ``env.opponent`` names (a path: it has a ``/`` or exists), None for ``self``, ``random`` or unset;
    any other word is left to ``build_factory``'s one-line refusal."""
    if opponent in (None, "self", "random"):
        return None
    return Path(opponent) if "/" in opponent or Path(opponent).exists() else None


class TextArenaEnvConfig(Frozen):
    """A TextArena game, moved with a ``move`` tool: a single-player one, or a two-player one against ``opponent``
    (docs/textarena.md; needs ``pip install 'harmonyrl[textarena]'``)."""

    name: Literal["textarena"] = "textarena"
    game: str = Field("GuessTheNumber-v0", min_length=1)
    """The TextArena game id, e.g. ``GuessTheNumber-v0``, ``TowerOfHanoi-v0`` (one player), ``TicTacToe-v0`` (two)."""
    opponent: str | None = None
    """Who plays a two-player game's other seat: ``self`` (self-play, both seats trained), ``random`` (a fixed
    opponent drawing among the moves the game lists) or a checkpoint folder (a fixed earlier policy, e.g. a run's
    ``checkpoints/final``, playing its seat as an episode of its own); required for a two-player game, refused for a
    one-player one."""
    opponent_temperature: float = Field(1.0, ge=0.0)
    """A checkpoint opponent's sampling temperature (0: greedy); its own moves only, in training and evaluation."""
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

    @property
    def opponent_checkpoint(self) -> Path | None:
        """The checkpoint folder ``opponent`` names, if it names one (its player is the run's to build)."""
        return checkpoint_named(self.opponent)

    def build_factory(self, seed: int, player: SeatPlayer | None = None) -> EnvFactory:
        """Seeds of ``game`` (a game draws its own state from its seed; the run's ``seed`` is not used); the game is
        made here, so one that cannot run (unknown, needs a download, three players, no opponent) stops the run in
        one line before any compute. ``player`` plays a checkpoint opponent's seat (:mod:`harmonyrl.run.opponent`);
        without one such a factory only lists its tasks."""
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
            return DuelFactory(self.game, "random", self.n_train, self.n_val, self.n_test)
        if self.opponent_checkpoint is not None:  # a checkpoint folder (checked when the config was read)
            return DuelFactory(self.game, self.opponent, self.n_train, self.n_val, self.n_test, player)
        raise UserCodeError(f"env.opponent '{self.opponent}' is not an opponent: give {OPPONENTS}")

    def build_expert(self) -> Expert:
        """A two-player game: uniformly random listed moves on the task's seat against the random opponent (its
        own policy: the warm start learns the format, not strategy; in self-play the warm start asks the team for
        each seat's expert instead, this one serves ``sft --export-demos``). A one-player game: the one-line error
        that there is none."""
        if self.opponent is not None:  # a checkpoint opponent's warm start too: it learns the format, not the game
            from harmonyrl.tasks.ecosystems.textarena_duel import DuelFactory

            return DuelFactory(game=self.game, n_train=1, n_val=0, n_test=1).expert
        raise UserCodeError(NO_EXPERT)

    @field_validator("opponent")
    @classmethod
    def _a_checkpoint_folder(cls, opponent: str | None) -> str | None:
        checkpoint_folder(checkpoint_named(opponent))
        return opponent

    @model_validator(mode="after")
    def _temperature_of_a_checkpoint(self) -> TextArenaEnvConfig:
        if self.opponent_temperature != 1.0 and self.opponent_checkpoint is None:
            raise ValueError("env.opponent_temperature is a checkpoint opponent's (env.opponent=<checkpoint folder>)")
        return self

    @field_validator("package_version")
    @classmethod
    def _same_version(cls, recorded: str) -> str:
        return same_version(recorded, "textarena", DISTRIBUTION, "textarena")
