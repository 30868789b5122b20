"""The typed action and observation of guess_env (what the server validates and the client parses)."""

from openenv.core.env_server.types import Action, Observation
from pydantic import Field


class GuessAction(Action):
    """Guess the hidden number."""

    guess: int = Field(..., description="Your guess, a whole number in the range the game states.")


class GuessObservation(Observation):
    """What the player reads after a reset or a guess."""

    feedback: str = Field(default="", description="The game's answer to the last guess.")
