"""A guess_env server that misbehaves on cue, for the OpenEnv adapter's fault tests: a guess of 13 takes 5 s to
answer (longer than the tests' step timeout), and the server takes one WebSocket session at a time (more episodes
than that must queue, not fault)."""

import time
from typing import Any

from guess_env.models import GuessAction, GuessObservation
from guess_env.server.environment import GuessEnvironment
from openenv.core.env_server.http_server import create_app


class SlowGuessEnvironment(GuessEnvironment):
    def step(self, action: GuessAction, timeout_s: float | None = None, **kwargs: Any) -> GuessObservation:  # type: ignore[override]
        if action.guess == 13:
            time.sleep(5)
        return super().step(action, timeout_s, **kwargs)


app = create_app(SlowGuessEnvironment, GuessAction, GuessObservation, env_name="slow_guess", max_concurrent_envs=1)
