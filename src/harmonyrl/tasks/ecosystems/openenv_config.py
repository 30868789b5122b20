"""The ``env`` config of ``env.name=openenv`` (docs/openenv.md): which OpenEnv client, which server (a running one's
URL, or an installed package's app the run starts on 127.0.0.1), and how episodes are drawn and paid. Reading it
imports no environment; the client is loaded, the server started or asked, and both checked when the factory is
built, before any compute."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from harmonyrl.envs.loader import TargetError, UserCodeError, resolve_target
from harmonyrl.frozen import Frozen
from harmonyrl.tasks.ecosystems.packages import module_version, same_env_version, same_version, version_of

if TYPE_CHECKING:
    from harmonyrl.tasks.custom import Expert
    from harmonyrl.tasks.ecosystems.openenv import OpenEnvFactory

DISTRIBUTION = "openenv-core"
NO_EXPERT = (
    "env.name=openenv has no scripted expert (an OpenEnv environment ships no demonstrations): give "
    "sft.expert=module:fn, sft.demos=FILE, or sft.steps=0 with model.init_from"
)


def _target(value: str | None) -> str | None:
    if value is None:
        return None
    try:
        return resolve_target(value)
    except TargetError as e:  # a custom error: the message reads without pydantic's "Value error, "
        raise PydanticCustomError("target", "{reason}", {"reason": str(e)}) from None


class OpenEnvEnvConfig(Frozen):
    """An OpenEnv environment over HTTP/WebSocket, its typed action a ``step`` tool (docs/openenv.md; needs
    ``pip install 'harmonyrl[openenv]'``)."""

    name: Literal["openenv"] = "openenv"
    client: str = Field(min_length=1)
    """The environment's OpenEnv client class, ``MODULE:CLASS`` (an ``EnvClient`` subclass), e.g.
    ``guess_env:GuessEnv``."""
    url: str | None = None
    """A running server's base URL (``http://127.0.0.1:8000``); or give ``app``."""
    app: str | None = None
    """An installed package's server app, ``MODULE:ATTR`` (``guess_env.server.app:app``), started on 127.0.0.1 by
    the run and stopped with it; or give ``url``."""
    action: str | None = None
    """The OpenEnv ``Action`` class, ``MODULE:CLASS``; null: the client's own (``EnvClient[Action, …]``)."""
    reset_kwargs: dict[str, bool | int | float | str | None] = Field(default_factory=dict)
    """Extra arguments of every ``reset`` (besides ``seed``), e.g. ``env.reset_kwargs.difficulty=2``."""
    n_train: int = Field(2000, ge=1)
    """Training seeds."""
    n_val: int = Field(200, ge=0)
    """Validation seeds (settings are chosen there)."""
    n_test: int = Field(200, ge=1)
    """Held-out test seeds."""
    sessions: int = Field(1, ge=1)
    """Episodes that hold a server session at once (the server's ``max_concurrent_envs``; more episodes wait)."""
    step_timeout_s: float = Field(30.0, gt=0)
    """How long one reset or step may take; a step without an answer is an environment fault, masked."""
    start_timeout_s: float = Field(60.0, gt=0)
    """How long the server started from ``app`` may take to answer ``/health``."""
    reward_range: tuple[float, float] = (0.0, 1.0)
    """The environment's episode return (low, high), mapped to harmonyrl's [0, 1] (clamped)."""
    instructions: str | None = Field(None, min_length=1)
    """The developer instructions of every episode (an OpenEnv environment has none of its own); null: "Act in the
    environment by calling the step tool; …" (``harmonyrl.tasks.ecosystems.openenv.INSTRUCTIONS``)."""
    memory: bool = False
    """Add the ``remember`` / ``recall`` notes tools (:mod:`harmonyrl.envs.memory`) to every episode."""
    package_version: str = Field(default_factory=lambda: version_of(DISTRIBUTION))
    """The openenv-core version the run was made with (recorded; another installed version is an error)."""
    env_version: str = ""
    """The environment's own code (:func:`~harmonyrl.tasks.ecosystems.packages.module_version` of the client's
    module, and the app's where it is another package): its distribution's version, or a hash of its source when it
    is imported from a folder; recorded with the run, other code at a resume or an eval is an error. Empty: filled
    in from what is importable now."""

    def build_factory(self, seed: int) -> OpenEnvFactory:
        """Seeds of the environment (it draws its own state from each reset's seed; the run's ``seed`` is not
        used); the server is started here when ``app`` is given."""
        from harmonyrl.tasks.ecosystems.openenv import INSTRUCTIONS, OpenEnvFactory

        return OpenEnvFactory(
            client=self.client,
            url=self.url,
            app=self.app,
            action=self.action,
            reset_kwargs=self.reset_kwargs,
            n_train=self.n_train,
            n_val=self.n_val,
            n_test=self.n_test,
            sessions=self.sessions,
            step_timeout_s=self.step_timeout_s,
            start_timeout_s=self.start_timeout_s,
            reward_range=self.reward_range,
            instructions=INSTRUCTIONS if self.instructions is None else self.instructions,
        )

    def build_expert(self) -> Expert:
        """None: the one-line error that an OpenEnv environment has no scripted expert."""
        raise UserCodeError(NO_EXPERT)

    @field_validator("client", "action")
    @classmethod
    def _resolve(cls, target: str | None) -> str | None:
        return _target(target)

    @field_validator("app")
    @classmethod
    def _module(cls, app: str | None) -> str | None:
        module, _, attr = (app or "x:x").partition(":")
        if not module or not attr or module.endswith(".py"):
            raise ValueError(
                f"env.app must be MODULE:ATTR (an importable server app, as uvicorn takes it), got {app!r}"
            )
        return app

    @field_validator("url")
    @classmethod
    def _http(cls, url: str | None) -> str | None:
        if url is not None and not url.startswith(("http://", "https://", "ws://", "wss://")):
            raise ValueError(f"env.url must start with http://, https://, ws:// or wss://, got {url!r}")
        return url

    @model_validator(mode="after")
    def _one_server(self) -> OpenEnvEnvConfig:
        if (self.url is None) == (self.app is None):
            raise ValueError("env.name=openenv needs exactly one of env.url (a running server) and env.app (an "
                             "installed package's server app, MODULE:ATTR, started by the run)")  # fmt: skip
        if not self.reward_range[0] < self.reward_range[1]:
            raise ValueError(f"env.reward_range must be (low, high) with low < high, got {list(self.reward_range)}")
        return self

    @field_validator("package_version")
    @classmethod
    def _same_version(cls, recorded: str) -> str:
        return same_version(recorded, "openenv.core", DISTRIBUTION, "openenv")

    @model_validator(mode="before")
    @classmethod
    def _record_env_version(cls, data: Any) -> Any:
        if isinstance(data, dict) and not data.get("env_version") and isinstance(data.get("client"), str):
            return {**data, "env_version": env_code_version(data["client"], data.get("app"))}  # recorded
        return data

    @model_validator(mode="after")
    def _same_env_version(self) -> OpenEnvEnvConfig:
        installed = env_code_version(self.client, self.app)
        same_env_version(self.env_version, installed, f"env.client={self.client}")
        return self


def env_code_version(client: str, app: str | None) -> str:
    """:func:`module_version` of the client's module, and of the app's where its top-level package differs."""
    modules = [client.partition(":")[0], *([app.partition(":")[0]] if isinstance(app, str) else [])]
    tops = dict.fromkeys(m if m.endswith(".py") or "/" in m else m.split(".", 1)[0] for m in modules)
    return "; ".join(f"{top}: {module_version(top)}" if len(tops) > 1 else module_version(top) for top in tops)
