"""guess_env's FastAPI app (``uvicorn guess_env.server.app:app``): HTTP and WebSocket endpoints of OpenEnv's server,
up to 64 concurrent sessions, one environment each."""

from openenv.core.env_server.http_server import create_app

from guess_env.models import GuessAction, GuessObservation
from guess_env.server.environment import GuessEnvironment

app = create_app(GuessEnvironment, GuessAction, GuessObservation, env_name="guess_env", max_concurrent_envs=64)


def main(host: str = "127.0.0.1", port: int = 8000) -> None:
    import uvicorn

    uvicorn.run(app, host=host, port=port)


if __name__ == "__main__":
    main()
