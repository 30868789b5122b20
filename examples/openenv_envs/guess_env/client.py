"""The guess_env client: OpenEnv's WebSocket ``EnvClient`` with guess_env's typed action and observation."""

from typing import Any

from openenv.core import EnvClient
from openenv.core.client_types import StepResult
from openenv.core.env_server.types import State

from guess_env.models import GuessAction, GuessObservation


class GuessEnv(EnvClient[GuessAction, GuessObservation, State]):
    """One guess_env session on a running server (``GuessEnv(base_url="http://127.0.0.1:8000")``)."""

    def _step_payload(self, action: GuessAction) -> dict[str, Any]:
        return {"guess": action.guess}

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[GuessObservation]:
        obs = payload.get("observation", {})
        observation = GuessObservation(
            feedback=obs.get("feedback", ""),
            done=payload.get("done", False),
            reward=payload.get("reward"),
            metadata=obs.get("metadata", {}),
        )
        return StepResult(observation=observation, reward=payload.get("reward"), done=payload.get("done", False))

    def _parse_state(self, payload: dict[str, Any]) -> State:
        return State(episode_id=payload.get("episode_id"), step_count=payload.get("step_count", 0))
