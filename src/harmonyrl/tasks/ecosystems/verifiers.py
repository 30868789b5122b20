"""verifiers (PyPI ``verifiers``, v1 API): an installed verifiers environment as a harmonyrl environment.

``env.name=verifiers env.id=vf_calc env.kwargs.num_tasks=500``

**Design, and why.** A verifiers v1 rollout is: a ``Taskset`` yields ``Task``\\ s; a ``Harness`` (by default the
``bash`` one, or ``null``: a plain chat-with-tools loop) runs as a *program* inside a ``Runtime`` (a subprocess, a
container, a hosted sandbox), bootstrapped with ``uv`` from the network; the program calls the model through an
OpenAI-compatible endpoint that verifiers' interception server (127.0.0.1) relays to the provider and records
into a ``Trace``; tools are ``Toolset``\\ s served over MCP, a process each; after the program ends the task scores
the trace with its ``@vf.reward`` functions and judges. Serving harmonyrl's engine as that provider endpoint
would run all of that unchanged, but (read in verifiers 0.4.0's source) every episode would start a harness
program and MCP servers, and the harness bootstrap downloads ``uv`` and the program's packages, which this
machine and CI cannot do offline; and control would be inverted: verifiers would drive the episode, so harmonyrl's
``Env`` contract, ``check-env``, Ray env workers and the async pipeline would not see it.

So harmonyrl plays the ``null`` harness itself, which is the same loop verifiers' chat program runs (send the
conversation, run every tool call and append its result, stop at a reply without tool calls), and everything
the environment's author wrote runs as written:

* **tasks**: ``env.id`` is the installed taskset module (``verifiers.v1.utils.loaders.taskset_class``), its config
  the taskset's own ``TasksetConfig`` built from ``env.kwargs`` (an unknown key is verifiers' own validation
  error, in one line). A v1 taskset has no train/test of its own, so a task's split is a hash of its ``key``
  (:mod:`.splits`: train / validation / test, disjoint). ``TaskData.system_prompt`` is the developer
  instructions, ``prompt`` the user message(s).
* **tools**: the task class's ``toolsets`` (``Task.toolsets(config)``, one fresh set per episode, ``setup`` and
  ``setup_task`` run at reset) as harmony function tools with MCP's schemas and names, called in process
  (:mod:`.verifiers_tools`).
* **rewards**: the episode's messages become a verifiers ``Trace`` turn by turn (:mod:`.verifiers_trace`); at the
  end ``Task.score(trace)`` runs every ``@vf.reward`` and ``@vf.metric``; each is one of the episode's reward terms
  (``reward/<name>``: its weighted value, harmonyrl's naming for composed rewards; ``metric/<name>``), recorded
  with every episode, and the episode's reward is ``trace.reward`` (the sum of the ``reward/`` terms), clamped to
  [0, 1]. ``correct`` is ``trace.reward >= 1``. ``@vf.stop`` predicates on the ``Trace`` or the
  ``Response`` run after every turn, as verifiers' session runs them; a stop ends the episode (truncated).
* **faults**: a reward or metric that raises (verifiers wraps it in ``TaskError``) is a masked ``reward_error``
  naming the exception's class, never a 0 for the model.
* **token exactness**: harmonyrl's own agent loop renders, samples and records the ids; nothing is re-tokenised,
  so the ids the learner trains on are the sampled ones by construction (a test checks a multi-turn tool episode's
  ids against a fresh render of its messages).

Refused in one line (before compute): a package that exports its own ``Env`` (multi-agent) or ``Harness`` (a
program run in a box), tasks that need a container or image (``NEEDS_CONTAINER``, ``TaskData.image``), toolsets
placed on a remote runtime or URL, LLM judges (``task.judges``: they call a hosted model), ``@vf.intercept``
rewrites and ``@vf.stop`` on the ``Request`` (they rewrite or veto what the model is sent: not token-exact here).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from harmonyrl.envs.loader import UserCodeError
from harmonyrl.envs.tools import Toolbox
from harmonyrl.envs.turns import ToolTurns, final_answer
from harmonyrl.tasks.ecosystems.packages import require
from harmonyrl.tasks.ecosystems.splits import three_way_split
from harmonyrl.tasks.ecosystems.verifiers_tools import served_tools
from harmonyrl.tasks.ecosystems.verifiers_trace import TraceRecorder
from harmonyrl.types import Failure, Message, Split, StepResult, Task, ToolSpec


def _vf() -> Any:
    require("verifiers.v1", "verifiers", "verifiers")
    import verifiers.v1 as vf

    return vf


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())


def load_taskset(env_id: str, kwargs: Mapping[str, object]) -> Any:
    """The installed taskset ``env_id`` built with its own config from ``kwargs``; refusals and errors in one
    line (:class:`UserCodeError`)."""
    _vf()
    from verifiers.v1.configs.taskset import TasksetConfig
    from verifiers.v1.envs.single_agent import SingleAgentEnv
    from verifiers.v1.utils.generic import concrete_type
    from verifiers.v1.utils.loaders import default_harness_id, environment_class, taskset_class

    setting = f"env.id '{env_id}'"
    try:
        cls = taskset_class(env_id)
    except (ModuleNotFoundError, TypeError, AttributeError, ValueError) as e:
        raise UserCodeError(f"{setting}: not an installed verifiers taskset ({_one_line(e)[:300]})") from None
    if environment_class(env_id) is not SingleAgentEnv:
        raise UserCodeError(f"{setting} exports its own verifiers Env (a multi-agent episode): not supported")
    if default_harness_id(env_id) == env_id:
        raise UserCodeError(f"{setting} ships its own Harness (a program run in a runtime box): not supported")
    config_cls = concrete_type(cls, TasksetConfig) or TasksetConfig
    try:
        config = config_cls.model_validate({"id": env_id, **kwargs})
    except Exception as e:
        raise UserCodeError(
            f"env.kwargs: {env_id}'s {config_cls.__name__} refuses them: {_one_line(e)[:300]}"
        ) from None
    try:
        return cls(config)
    except Exception as e:
        raise UserCodeError(
            f"{setting}: building the taskset raised {type(e).__name__}: {_one_line(e)[:300]}"
        ) from None


def refusal(task: Any) -> str | None:
    """Why harmonyrl cannot run ``task`` faithfully here (None: it can)."""
    from verifiers.v1.runtimes import SubprocessConfig

    data = task.data
    if type(task).NEEDS_CONTAINER or data.image:
        return "needs a container runtime (a sandbox box)"
    if task.config.judges:
        return "is scored by an LLM judge (a hosted model over the network)"
    for toolset in type(task).toolsets(task.config):
        cfg = toolset.config
        if getattr(cfg, "url", None) or not isinstance(getattr(cfg, "runtime", SubprocessConfig()), SubprocessConfig):
            return f"places toolset {type(toolset).__name__} on a remote runtime or URL"
    from verifiers.v1.utils.decorators import discover_decorated

    if discover_decorated(task, "intercept"):
        return "rewrites requests or responses with @vf.intercept (not token-exact)"
    from verifiers.v1.session import hook_boundary

    vf = _vf()
    if any(hook_boundary(fn, allow_trace=True) is vf.Request for fn in task.hooks("stop")):
        return "stops on the Request with @vf.stop (vetoes what the model is sent)"
    return None


def _opening(data: Any) -> tuple[str, list[Message], list[Any]]:
    """(instructions, harmony user messages, the verifiers messages the chat program opens with)."""
    vf = _vf()
    system = data.system_prompt or ""
    prompt = data.prompt
    if isinstance(prompt, str) or prompt is None:
        users = [prompt or ""]
        opening = [vf.UserMessage(content=prompt or "")]
    else:
        users = [vf.types.content_text(m.content) for m in prompt if m.role == "user"]
        opening = [m for m in prompt if m.role != "system"]
    if system:
        opening = [vf.SystemMessage(content=system), *opening]
    return system, [Message(role="user", content=u) for u in users], opening


class VerifiersFactory:
    """The tasks of an installed verifiers taskset in disjoint splits; one :class:`VerifiersEnv` per episode."""

    name = "verifiers"

    def __init__(
        self,
        env_id: str,
        kwargs: Mapping[str, object] | None = None,
        max_tasks: int = 100_000,
        tool_timeout_s: float = 10.0,
    ) -> None:
        self.env_id, self.tool_timeout_s = env_id, tool_timeout_s
        taskset = load_taskset(env_id, dict(kwargs or {}))
        view = taskset.take(max_tasks) if not taskset.bounded else taskset
        out: dict[Split, list[Task]] = {"train": [], "validation": [], "test": []}
        self._tasks: dict[str, Any] = {}
        try:
            loaded = list(view)
        except Exception as e:
            raise UserCodeError(
                f"env.id '{env_id}': its load() raised {type(e).__name__}: {_one_line(e)[:300]}"
            ) from None
        for vf_task in loaded[:max_tasks]:
            if (why := refusal(vf_task)) is not None:
                raise UserCodeError(f"env.id '{env_id}': task {vf_task.data.idx} {why}: not supported")
            split = three_way_split(f"{env_id}:{vf_task.key}")
            task_id = f"vf-{env_id}-{split}-{len(out[split]):05d}"
            answer = getattr(vf_task.data, "answer", None)
            prompt = vf_task.data.prompt_text
            out[split].append(Task(task_id, prompt, "" if answer is None else str(answer), split))
            self._tasks[task_id] = vf_task
        self._splits = {s: tuple(v) for s, v in out.items()}

    def tasks(self, split: Split) -> Sequence[Task]:
        return self._splits[split]

    def make(self, task: Task) -> VerifiersEnv:
        return VerifiersEnv(task, self._tasks[task.id], self.tool_timeout_s)

    def vf_task(self, task: Task) -> Any:
        """The verifiers ``Task`` behind ``task``."""
        return self._tasks[task.id]


class VerifiersEnv:
    """One episode of a verifiers task, harmonyrl playing the ``null`` harness (module docstring)."""

    def __init__(self, task: Task, vf_task: Any, tool_timeout_s: float) -> None:
        self.task, self.vf_task = task, vf_task
        self._toolsets = type(vf_task).toolsets(vf_task.config)
        tools, self._declared = served_tools(self._toolsets, tool_timeout_s)
        self._episode = ToolTurns(Toolbox(tools))
        self._instructions, self._users, self._opening = _opening(vf_task.data)
        self._recorder: TraceRecorder | None = None

    @property
    def tools(self) -> Sequence[ToolSpec]:
        return self._episode.toolbox.specs

    @property
    def instructions(self) -> str:
        return self._instructions

    async def reset(self) -> list[Message]:
        self._episode.reset()
        for toolset in self._toolsets:
            await toolset.setup()
            await toolset.setup_task(self.vf_task)
        self._recorder = TraceRecorder(self.vf_task, self._declared, self._opening)
        return list(self._users)

    async def step(self, action: Sequence[Message]) -> StepResult:
        recorder = self._recorder
        if recorder is None:
            raise RuntimeError("step() before reset()")
        response = recorder.assistant(action)
        if (tool_turn := await self._episode.step(action)) is not None:
            if tool_turn.failure is not None:
                return tool_turn
            for obs in tool_turn.observations:
                recorder.tool_result(0, obs.name.split(".", 1)[-1] if obs.name else "", obs.content)
            if await self._stopped(response):
                return await self._score(truncated=True)
            return tool_turn
        return await self._score(truncated=await self._stopped(response))

    async def _stopped(self, response: Any) -> bool:
        """Whether a ``@vf.stop`` predicate on the trace or this turn's response fired (as verifiers' session
        runs them after every turn); the predicate's name is recorded as the trace's stop condition."""
        from verifiers.v1.session import call_hook, hook_boundary

        vf = _vf()
        assert self._recorder is not None
        trace = self._recorder.trace
        for fn in self.vf_task.hooks("stop"):
            boundary = hook_boundary(fn, allow_trace=True)
            arguments = {vf.Trace: trace} if boundary is vf.Trace else {vf.Response: response, vf.Trace: trace}
            if await call_hook(fn, arguments):
                trace.stop(fn.__name__)
                return True
        return False

    async def _score(self, truncated: bool) -> StepResult:
        assert self._recorder is not None
        recorder = self._recorder
        recorder.close()
        trace = recorder.trace
        try:
            await self.vf_task.score(trace)
        except Exception as e:  # verifiers' boundary wraps the rubric's own exception in TaskError
            cause = e.__cause__ if e.__cause__ is not None else e
            detail = f"{type(cause).__name__} in {type(self.vf_task).__name__} scoring: {_one_line(cause)[:200]}"
            return StepResult(terminated=not truncated, truncated=truncated, failure=Failure("reward_error", detail))
        terms = {f"reward/{k}": float(r.value) for k, r in trace.rewards.items() if r is not None}
        terms |= {f"metric/{k}": float(v) for k, v in trace.metrics.items() if v is not None}
        total = float(trace.reward)
        answered = final_answer(self._last_action(trace)) is not None
        info = {
            "correct": float(total >= 1.0),
            "format_error": float(not answered),
            "tool_calls": float(self._episode.tool_calls),
            "turns": float(recorder.turns),
            **terms,
        }
        return StepResult(reward=min(1.0, max(0.0, total)), terminated=not truncated, truncated=truncated, info=info)

    @staticmethod
    def _last_action(trace: Any) -> list[Message]:
        replies = trace.assistant_messages
        if not replies or replies[-1].tool_calls or replies[-1].content is None:
            return []
        return [Message(role="assistant", channel="final", content=replies[-1].content)]

    async def close(self) -> None:
        self._episode.done = True


def custom_factory(id: str, max_tasks: int = 100_000, **kwargs: object) -> VerifiersFactory:
    """``env.name=custom env.factory=harmonyrl.tasks.ecosystems.verifiers:custom_factory env.kwargs.id=vf_calc``."""
    return VerifiersFactory(id, kwargs, max_tasks)
