"""guess_env's server side: the environment and the FastAPI app that serves it."""
