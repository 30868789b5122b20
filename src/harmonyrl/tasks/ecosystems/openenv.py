"""OpenEnv (PyPI ``openenv-core``): an OpenEnv environment, served over HTTP/WebSocket, as a harmonyrl environment.

``env.name=openenv env.client=guess_env:GuessEnv env.app=guess_env.server.app:app`` (the run starts the package's
server on 127.0.0.1: :mod:`.openenv_server`), or ``env.url=http://127.0.0.1:8000`` for a server already running.

What is mapped to what:

* **tasks**: an OpenEnv environment has no task list; an episode is ``reset(seed=s, **env.reset_kwargs)``, so a task
  is a seed, its split a hash of (client, seed) (:mod:`.splits`). The reset's observation is the user message.
* **actions**: the environment's typed ``Action`` (the client's first generic argument, ``EnvClient[Action, …]``, or
  ``env.action``) is one harmony function tool, ``step``: its JSON schema (less OpenEnv's ``metadata``) is the tool's
  parameters, its docstring the description. A call is validated as that ``Action`` (a mismatch is the model's
  ``invalid arguments`` observation) and sent with the user's own client (``client.step(action)``: its
  ``_step_payload`` and ``_parse_result`` run unchanged); the observation comes back as the tool's result.
* **observations**: the observation's own fields (``done``, ``reward`` and ``metadata`` left out: the model reads
  what the environment shows a player); one string field is shown as it is, several as JSON.
* **reward**: OpenEnv pays a reward per step; the episode's return (their sum) is paid when the environment says
  ``done``, mapped linearly from ``env.reward_range`` (low, high) to [0, 1] and clamped; ``correct`` is a return
  at ``high`` or above, ``return`` the raw sum. A ``final`` message ends the episode unfinished: reward 0,
  ``format_error``.
* **faults, by class** (the rule of :mod:`harmonyrl.envs.tools`: the model's doing is an observation, only what says
  nothing about the model is masked):

  ===============================================================  =============================================
  the server answers ``VALIDATION_ERROR`` (the action's shape)     observation (the model reads the error)
  the server answers ``EXECUTION_ERROR`` (the env's step raised)   observation: the env raised on the model's
                                                                   action, as a tool raising on its arguments
  no answer within ``env.step_timeout_s``                          ``tool_timeout``, masked
  the connection refused or dropped (the server died)              ``tool_crash``, masked
  any other server error (capacity, factory, session), or the      ``tool_crash``, masked, naming the class
  client's own code raising on the reply
  ``reset`` failing in any way (the server down, a bad reply)      ``env_error``, masked (the scheduler)
  ===============================================================  =============================================

Concurrency: a server takes a fixed number of WebSocket sessions (its ``max_concurrent_envs``); an episode holds
one from ``reset`` to ``close``, and at most ``env.sessions`` episodes hold one at a time (the others wait), so a
batch larger than the server's capacity queues instead of faulting.

Refused in one line, before compute: a client that is not importable or not an OpenEnv ``EnvClient``, an action
type that is not an OpenEnv ``Action``, a URL that does not answer, a server whose action schema has other fields
than the client's, a server app that does not start. Not supported: MCP-tool environments (``CallToolAction``:
docs/openenv.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import typing
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from harmonyrl.envs.loader import TargetError, UserCodeError, load_callable, resolve_target
from harmonyrl.envs.tools import Tool, Toolbox, ToolInfraError, _strip_titles
from harmonyrl.envs.turns import ToolTurns
from harmonyrl.tasks.ecosystems.openenv_server import LocalServer, answers
from harmonyrl.tasks.ecosystems.packages import require
from harmonyrl.tasks.ecosystems.splits import three_way_split
from harmonyrl.types import Message, Split, StepResult, Task, ToolSpec

INSTRUCTIONS = "Act in the environment by calling the step tool; each call is one action, its result what follows."
"""The developer instructions when ``env.instructions`` is not given (an OpenEnv environment has none)."""
TOOL_NAME = "step"
HIDDEN_FIELDS = ("done", "reward", "metadata")
"""OpenEnv's bookkeeping on every observation: not shown to the model."""
_MAX_RESET_TRIES = 200
"""A bound on the connect-and-reset attempts of one episode (besides ``step_timeout_s``)."""
MODEL_CODES = ("VALIDATION_ERROR", "EXECUTION_ERROR")
"""Server error codes that the model's action caused (an observation); every other code is a masked fault."""


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())


def _core() -> Any:
    return require("openenv.core", "openenv-core", "openenv")


def load_class(target: str, setting: str) -> type:
    """The class at ``MODULE:NAME`` (or ``file.py:NAME``), or a one-line :class:`UserCodeError`."""
    try:
        found = load_callable(resolve_target(target))
    except TargetError as e:
        raise UserCodeError(f"{setting}={target}: {e}") from None
    except Exception as e:  # the module itself raising while it is imported
        raise UserCodeError(
            f"{setting}={target}: importing it raised {type(e).__name__}: {_one_line(e)[:200]}"
        ) from None
    if not isinstance(found, type):
        raise UserCodeError(f"{setting}={target} is not a class")
    return found


def client_class(target: str) -> type:
    """The user's OpenEnv client class (an ``EnvClient`` subclass)."""
    cls = load_class(target, "env.client")
    if not issubclass(cls, _core().EnvClient):
        raise UserCodeError(f"env.client={target} is not an OpenEnv EnvClient (openenv.core.EnvClient) subclass")
    return cls


def action_class(client: type, target: str | None) -> type:
    """The environment's typed ``Action``: ``target`` (``env.action``) if given, else the client's first generic
    argument (``class MyEnv(EnvClient[MyAction, MyObservation, State])``)."""
    base = _core().Action
    if target is not None:
        cls = load_class(target, "env.action")
    else:
        declared = [
            typing.get_args(b)[0]
            for k in client.__mro__
            for b in getattr(k, "__orig_bases__", ())
            if typing.get_args(b) and isinstance(typing.get_args(b)[0], type)
        ]
        if not declared or not issubclass(declared[0], base):
            raise UserCodeError(
                f"env.client {client.__name__} does not declare a typed OpenEnv Action "
                "(EnvClient[MyAction, MyObservation, State]): give env.action=module:MyAction"
            )
        cls = declared[0]
    if not issubclass(cls, base):
        raise UserCodeError(f"env.action={target}: {cls.__name__} is not an OpenEnv Action (openenv.core Action)")
    if cls.__name__ == "CallToolAction":
        raise UserCodeError("env.client: an MCP-tool OpenEnv environment (CallToolAction) is not supported yet")
    return cls


def action_schema(action: type) -> dict[str, object]:
    """The action's JSON schema as the model reads it: no ``metadata``, no pydantic titles."""
    schema = dict(typing.cast(dict[str, Any], _strip_titles(action.model_json_schema())))  # type: ignore[attr-defined]
    properties = {k: v for k, v in schema.get("properties", {}).items() if k != "metadata"}
    schema.pop("description", None)
    return {**schema, "properties": properties}


def server_fields(url: str, timeout_s: float) -> set[str] | None:
    """The action fields the server at ``url`` declares (``GET /schema``), less ``metadata``; None if unreadable."""
    import urllib.request

    try:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(f"{url}/schema", timeout=timeout_s) as r:
            fields = json.loads(r.read())["action"].get("properties", {})
    except (OSError, ValueError, KeyError, AttributeError):
        return None
    return {k for k in fields if k != "metadata"}


def render(observation: object) -> str:
    """What the model reads of an observation (module docstring)."""
    if hasattr(observation, "model_dump"):
        data = observation.model_dump(mode="json", exclude=set(HIDDEN_FIELDS))
    elif isinstance(observation, Mapping):
        data = {k: v for k, v in observation.items() if k not in HIDDEN_FIELDS}
    else:
        return str(observation)
    if len(data) == 1 and isinstance(text := next(iter(data.values())), str):
        return text
    return json.dumps(data, ensure_ascii=False)


def server_code(error: BaseException) -> str | None:
    """The OpenEnv error code of a server's error reply (``EnvClient`` raises ``RuntimeError("Server error: …
    (code: X)")``), else None."""
    text = str(error)
    if isinstance(error, RuntimeError) and text.startswith("Server error:") and text.endswith(")"):
        return text.rpartition("(code: ")[2].rstrip(")") or None
    return None


class EnvActionError(Exception):
    """The environment refused or raised on the model's action (a server ``VALIDATION_ERROR`` or
    ``EXECUTION_ERROR``): the model reads it as the tool's error."""


class Sessions:
    """At most ``n`` episodes hold a server session at once, per event loop (an ``asyncio.Semaphore`` belongs to
    the loop it first waited in; a run's eval and its rollouts may use different loops)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self._gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )

    def gate(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if loop not in self._gates:
            self._gates[loop] = asyncio.Semaphore(self.n)
        return self._gates[loop]


class OpenEnvEnv:
    """One episode: a WebSocket session of the user's client on the server, moved with the ``step`` tool."""

    def __init__(self, task: Task, factory: OpenEnvFactory, seed: int) -> None:
        self.task, self._factory, self._seed = task, factory, seed
        self._client: Any = None
        self._gate: asyncio.Semaphore | None = None
        self._return = 0.0
        self._done = False
        self._steps = 0
        timeout = factory.step_timeout_s + 1.0  # the client's own timeout fires first and is classified in _act
        act = Tool(TOOL_NAME, factory.description, factory.parameters, self._act, factory.action, timeout)
        self._episode = ToolTurns(Toolbox([act]))

    @property
    def tools(self) -> Sequence[ToolSpec]:
        return self._episode.toolbox.specs

    @property
    def instructions(self) -> str:
        return self._factory.instructions

    async def reset(self) -> list[Message]:
        self._episode.reset()
        self._return, self._done, self._steps = 0.0, False, 0
        if self._gate is None:
            self._gate = self._factory.sessions.gate()
            await self._gate.acquire()
        result = await self._open_session()
        self._return = float(result.reward or 0.0)
        return [Message(role="user", content=render(result.observation))]

    async def _open_session(self) -> Any:
        """Connect and reset. A server frees a session only after it has seen the last one's socket close, so a
        ``CAPACITY_REACHED`` right after another episode's ``close`` is retried (every 0.05 s, doubling to 1 s)
        until ``step_timeout_s`` has passed; any other error propagates (``reset`` failing: ``env_error``)."""
        f = self._factory
        loop = asyncio.get_running_loop()
        deadline, pause = loop.time() + f.step_timeout_s, 0.05
        for _ in range(_MAX_RESET_TRIES):
            self._client = f.client(
                base_url=f.url, connect_timeout_s=f.step_timeout_s, message_timeout_s=f.step_timeout_s
            )
            try:
                return await asyncio.wait_for(self._client.reset(seed=self._seed, **f.reset_kwargs), f.step_timeout_s)
            except RuntimeError as e:
                if server_code(e) != "CAPACITY_REACHED" or loop.time() + pause > deadline:
                    raise
            await self._disconnect()
            await asyncio.sleep(pause)
            pause = min(1.0, pause * 2)
        raise RuntimeError(f"the server at {f.url} had no free session after {_MAX_RESET_TRIES} tries")

    async def _act(self, **fields: Any) -> str:
        if fields.pop("metadata", None):
            raise EnvActionError("metadata is not an action field to set")
        if self._done:
            return "The episode is over."
        action = self._factory.action(**fields)
        try:
            result = await self._client.step(action)
        except TimeoutError:
            raise ToolInfraError(f"no answer within {self._factory.step_timeout_s:g}s", "tool_timeout") from None
        except Exception as e:
            code = server_code(e)
            if code in MODEL_CODES:
                raise EnvActionError(str(e).removeprefix("Server error: ")) from None
            what = f"server error {code}" if code else type(e).__name__
            raise ToolInfraError(f"{what}: {_one_line(e)[:300]}") from None
        self._steps += 1
        self._return += float(result.reward or 0.0)
        self._done = bool(result.done)
        return render(result.observation)

    async def step(self, action: Sequence[Message]) -> StepResult:
        turn = await self._episode.step(action)
        if turn is not None and not self._done:
            return turn
        if turn is not None and turn.failure is not None:
            return turn
        low, high = self._factory.reward_range
        info = {
            "correct": float(self._done and self._return >= high),
            "return": self._return,
            "format_error": float(not self._done),
            "steps": float(self._steps),
        }
        reward = min(1.0, max(0.0, (self._return - low) / (high - low))) if self._done else 0.0
        return StepResult(reward=reward, terminated=True, info=info)

    async def _disconnect(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(TimeoutError, OSError):  # the session ends on the server when the socket does
                await asyncio.wait_for(client.disconnect(), 2.0)

    async def close(self) -> None:
        self._episode.done = True
        try:
            await self._disconnect()
        finally:
            if self._gate is not None:
                self._gate.release()
                self._gate = None


class OpenEnvFactory:
    """Seeds of an OpenEnv environment in disjoint splits, played through the user's client on a server at
    ``url`` or on one started from ``app``; one :class:`OpenEnvEnv` per episode (module docstring)."""

    name = "openenv"

    def __init__(
        self,
        client: str,
        url: str | None = None,
        app: str | None = None,
        action: str | None = None,
        reset_kwargs: Mapping[str, object] | None = None,
        n_train: int = 2000,
        n_val: int = 200,
        n_test: int = 200,
        sessions: int = 1,
        step_timeout_s: float = 30.0,
        start_timeout_s: float = 60.0,
        reward_range: tuple[float, float] = (0.0, 1.0),
        instructions: str = INSTRUCTIONS,
    ) -> None:
        if (url is None) == (app is None):
            raise UserCodeError("env.name=openenv needs exactly one of env.url (a running server) and env.app "
                                "(an installed package's server app, MODULE:ATTR, started here)")  # fmt: skip
        if not reward_range[0] < reward_range[1]:
            raise UserCodeError(f"env.reward_range must be (low, high) with low < high, got {reward_range}")
        self.client = client_class(client)
        self.action = action_class(self.client, action)
        self.parameters = action_schema(self.action)
        self.description = " ".join((self.action.__doc__ or self.action.__name__).split())
        self.reset_kwargs = dict(reset_kwargs or {})
        self.step_timeout_s, self.reward_range, self.instructions = step_timeout_s, reward_range, instructions
        self.sessions = Sessions(sessions)
        self.server = None if app is None else LocalServer(app, start_timeout_s)
        self.url = self.server.url if self.server is not None else str(url).rstrip("/")
        if self.server is None and (why := answers(self.url, timeout_s=min(10.0, step_timeout_s))) is not None:
            raise UserCodeError(f"env.url {self.url} does not answer ({why})")
        declared = server_fields(self.url, timeout_s=min(10.0, step_timeout_s))
        ours = set(typing.cast(dict[str, object], self.parameters["properties"]))
        if declared is not None and declared != ours:
            raise UserCodeError(f"env.client {self.client.__name__}'s action {self.action.__name__} has fields "
                                f"{sorted(ours)}, but the server at {self.url} takes {sorted(declared)}")  # fmt: skip
        self.key = f"{self.client.__module__}.{self.client.__name__}"
        self._splits, self._seeds = self._draw(n_train, n_val, n_test)

    def _draw(self, n_train: int, n_val: int, n_test: int) -> tuple[dict[Split, tuple[Task, ...]], dict[str, int]]:
        want: dict[Split, int] = {"train": n_train, "validation": n_val, "test": n_test}
        out: dict[Split, list[Task]] = {"train": [], "validation": [], "test": []}
        seeds: dict[str, int] = {}
        seed = 0
        while any(len(out[s]) < want[s] for s in out):
            split = three_way_split(f"{self.key}:{seed}")
            if len(out[split]) < want[split]:
                task_id = f"oe-{self.client.__name__}-{split}-{len(out[split]):05d}"
                out[split].append(Task(task_id, f"{self.client.__name__} seed {seed}", "", split))
                seeds[task_id] = seed
            seed += 1
        return {s: tuple(v) for s, v in out.items()}, seeds

    def tasks(self, split: Split) -> Sequence[Task]:
        return self._splits[split]

    def make(self, task: Task) -> OpenEnvEnv:
        return OpenEnvEnv(task, self, self._seeds[task.id])

    def close(self) -> None:
        """Stop the server this factory started (if any); also done at exit."""
        if self.server is not None:
            self.server.stop()
