"""guess_env: find a hidden number from "higher" / "lower" hints, an OpenEnv environment in the layout of OpenEnv's
own template (``openenv init``): typed models, a WebSocket client, and a FastAPI server app."""

from guess_env.client import GuessEnv
from guess_env.models import GuessAction, GuessObservation

__all__ = ["GuessAction", "GuessEnv", "GuessObservation"]
