"""The ``env`` config of ``env.name=textarena`` (docs/textarena.md): which single-player TextArena game and how many
seeds per split. Reading it imports no environment; the game is made (and refused in one line if it cannot run
here) when the factory is built, before any compute."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field, field_validator

from harmonyrl.envs.loader import UserCodeError
from harmonyrl.frozen import Frozen
from harmonyrl.tasks.ecosystems.packages import same_version, version_of

if TYPE_CHECKING:
    from harmonyrl.tasks.custom import Expert
    from harmonyrl.tasks.ecosystems.textarena import TextArenaFactory

DISTRIBUTION = "textarena"
NO_EXPERT = (
    "env.name=textarena has no scripted expert (TextArena ships no demonstrations): give sft.expert=module:fn, "
    "sft.demos=FILE, or sft.steps=0 with model.init_from"
)


class TextArenaEnvConfig(Frozen):
    """A single-player TextArena game, moved with a ``move`` tool (docs/textarena.md; needs ``pip install
    'harmonyrl[textarena]'``)."""

    name: Literal["textarena"] = "textarena"
    game: str = Field("GuessTheNumber-v0", min_length=1)
    """The TextArena game id, e.g. ``GuessTheNumber-v0``, ``TowerOfHanoi-v0``, ``Minesweeper-v0``."""
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

    def build_factory(self, seed: int) -> TextArenaFactory:
        """Seeds of ``game`` (a game draws its own state from its seed; the run's ``seed`` is not used)."""
        from harmonyrl.tasks.ecosystems.textarena import TextArenaFactory

        return TextArenaFactory(game=self.game, n_train=self.n_train, n_val=self.n_val, n_test=self.n_test)

    def build_expert(self) -> Expert:
        """None: the one-line error that a TextArena game has no scripted expert."""
        raise UserCodeError(NO_EXPERT)

    @field_validator("package_version")
    @classmethod
    def _same_version(cls, recorded: str) -> str:
        return same_version(recorded, "textarena", DISTRIBUTION, "textarena")
