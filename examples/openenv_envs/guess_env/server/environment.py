"""guess_env's environment: a number in 1..high drawn from the reset's seed, found with at most ``max_guesses``
guesses; reward 1 for finding it, 0 otherwise. A guess outside the range makes ``step`` raise (the server answers
with an EXECUTION_ERROR), as an environment written without RL in mind may."""

import random
from typing import Any
from uuid import uuid4

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import State

from guess_env.models import GuessAction, GuessObservation


class GuessEnvironment(Environment):
    """Find the hidden number (module docstring)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, high: int = 16, max_guesses: int = 6) -> None:
        super().__init__()
        self.high, self.max_guesses = high, max_guesses
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self._target = 1

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> GuessObservation:
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        self._target = random.Random(seed).randint(1, self.high)
        return GuessObservation(
            feedback=f"I am thinking of a whole number from 1 to {self.high}. You have {self.max_guesses} guesses; "
            "after each I say whether it is higher or lower."
        )

    def step(self, action: GuessAction, timeout_s: float | None = None, **kwargs: Any) -> GuessObservation:  # type: ignore[override]
        if not 1 <= action.guess <= self.high:
            raise ValueError(f"guess {action.guess} is outside 1..{self.high}")
        self._state.step_count += 1
        left = self.max_guesses - self._state.step_count
        if action.guess == self._target:
            return GuessObservation(feedback=f"{action.guess} is right!", done=True, reward=1.0)
        hint = "higher" if self._target > action.guess else "lower"
        if left == 0:
            return GuessObservation(
                feedback=f"It is {hint} than {action.guess}. No guesses left.", done=True, reward=0.0
            )
        return GuessObservation(feedback=f"It is {hint} than {action.guess}. {left} left.", reward=0.0)

    @property
    def state(self) -> State:
        return self._state
