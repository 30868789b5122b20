"""``check_env``: contract checks a user runs on their own environment (in the spirit of Gymnasium's).

It drives a few episodes with scripted actions and reports what breaks the contract the rollout layer
relies on, as a list of issues rather than the first exception, so one run shows everything:

* protocol: the factory has ``name`` (a str), ``tasks(split)`` and ``make(task)``, and what ``make`` returns has
  ``tools``, ``instructions``, ``reset``, ``step`` and ``close`` (checked first: without them nothing else can run);
* splits: non-empty, ``Task.split`` matches, ids unique, no prompt shared by two of train, validation and test (a
  factory with no validation split of its own is not an issue: a run carves one from train, and the report says so);
* determinism: a second factory from ``rebuild`` yields identical tasks;
* API shape: ``reset`` returns messages, ``step`` returns a ``StepResult``, tools have object JSON schemas;
* semantics: a ``final`` answer terminates, never terminated *and* truncated, rewards finite in [0, 1],
  ``info`` values are floats, a malformed tool call is an observation (model fault), not a crash or failure;
* wrong arguments (:func:`wrong_arguments`): every tool is called with what a model will send sooner or later
  (missing or mistyped fields, empty and unknown strings, zero, negative and huge numbers), and where each call
  lands is recorded as a :class:`ToolProbe`: an error observation the model reads (``KeyError``, ``invalid
  arguments``...), a plain result, or a masked environment fault. A masked fault caused by the model's own
  arguments breaks invariant 5 (a policy heading for a 0 would learn to trigger it to escape), so it is an error;
  a timeout is a warning (the rule masks timeouts, but the model's argument caused this one);
* ``reset``/``step``/``close`` are ``async def`` (the rollout awaits them).

An issue found for several tasks is reported once, with how many tasks share it. Warnings (a tool or a
parameter the model sees no description of) are listed but do not fail the check.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import json
import math
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from harmonyrl.envs.base import Env, EnvFactory
from harmonyrl.envs.loader import TargetError, load_factory, where_in_user_code
from harmonyrl.envs.taskfile import carve_validation
from harmonyrl.envs.tools import ToolSchemaError
from harmonyrl.types import Message, Split, StepResult, Task, ToolSpec


@dataclass(frozen=True)
class CheckIssue:
    check: str
    detail: str
    task_id: str | None = None
    severity: Literal["error", "warning"] = "error"
    also: int = 0
    """How many more tasks had the same issue (reported once)."""

    def __str__(self) -> str:
        more = f" and {self.also} more task{'s' * (self.also > 1)}" if self.also else ""
        where = f" [{self.task_id}{more}]" if self.task_id else ""
        return f"{self.check}{where}: {self.detail}"


def errors(issues: Sequence[CheckIssue]) -> list[CheckIssue]:
    """The issues that fail the check (warnings left out)."""
    return [i for i in issues if i.severity == "error"]


def dedupe(issues: Sequence[CheckIssue]) -> list[CheckIssue]:
    """One issue per (check, detail, severity), in first-seen order, counting the other tasks that had it."""
    seen: dict[tuple[str, str, str], CheckIssue] = {}
    for issue in issues:
        key = (issue.check, issue.detail, issue.severity)
        first = seen.get(key)
        seen[key] = issue if first is None else replace(first, also=first.also + 1)
    return list(seen.values())


FACTORY_MEMBERS = ("name", "tasks", "make")
"""What the :class:`~harmonyrl.envs.base.EnvFactory` protocol needs (``name`` a str, the others callables)."""
ENV_MEMBERS = ("tools", "instructions", "reset", "step", "close")
"""What the :class:`~harmonyrl.envs.base.Env` protocol needs (``reset``, ``step``, ``close`` callables)."""


def _lacks(obj: object, members: Sequence[str], values: Sequence[str]) -> list[str]:
    """Members of ``obj`` that are missing (or raise when read), or not callable where a method is needed;
    ``values`` are the members that are plain values (``name`` must be a str)."""
    missing = []
    for member in members:
        try:
            found = getattr(obj, member)
        except Exception:  # a user's property that raises: as good as missing, and said the same way
            missing.append(member)
            continue
        wrong_name = member == "name" and not isinstance(found, str)
        if wrong_name or (member not in values and not callable(found)):
            missing.append(member)
    return missing


def protocol_issue(factory: object) -> CheckIssue | None:
    """The rule ``factory`` breaks when it is not an :class:`~harmonyrl.envs.base.EnvFactory` at all (e.g. a
    class with no methods, or a function that returns None), else None."""
    missing = _lacks(factory, FACTORY_MEMBERS, ("name",))
    if not missing:
        return None
    return CheckIssue(
        "protocol",
        f"the factory is a {type(factory).__name__}, which lacks {', '.join(missing)}: an EnvFactory needs "
        "name (a str), tasks(split) and make(task) (docs/custom-env.md)",
    )


def _env_protocol(env: object) -> str | None:
    missing = _lacks(env, ENV_MEMBERS, ("tools", "instructions"))
    if not missing:
        return None
    return (
        f"make(task) returned a {type(env).__name__}, which lacks {', '.join(missing)}: an Env needs tools, "
        "instructions, and async reset(), step(action), close()"
    )


def missing_validation(factory: EnvFactory) -> str | None:
    """Why ``factory`` has no validation split of its own, or None when it has one: ``tasks("validation")`` raises,
    is empty, or returns tasks of another split (a factory written before validation existed often answers every
    split but "train" with its test tasks). A run then carves one from the train split
    (:mod:`harmonyrl.tasks.custom`)."""
    try:
        tasks = list(factory.tasks("validation"))
    except Exception as e:  # the user's code: any exception means "no validation split", said in one line
        return f"tasks('validation') raised {type(e).__name__}: {e}"[:200]
    if not tasks:
        return "tasks('validation') is empty"
    if others := sorted({str(getattr(t, "split", "?")) for t in tasks} - {"validation"}):
        return f"tasks('validation') returned tasks whose Task.split is {', '.join(map(repr, others))}"
    return None


def _check_splits(factory: EnvFactory, rebuild: Callable[[], EnvFactory] | None) -> list[CheckIssue]:
    issues: list[CheckIssue] = []
    splits: dict[Split, list[Task]] = {s: list(factory.tasks(s)) for s in ("train", "test")}
    if missing_validation(factory) is None:  # else a run carves one (reported by acheck_report, not an issue)
        splits["validation"] = list(factory.tasks("validation"))
    for split, tasks in splits.items():
        if not tasks:
            issues.append(CheckIssue("splits", f"{split} split is empty"))
        if any(not isinstance(t, Task) or t.split != split for t in tasks):
            issues.append(CheckIssue("splits", f"{split} split holds non-Task items or a wrong Task.split"))
    ids = [t.id for tasks in splits.values() for t in tasks]
    if len(set(ids)) != len(ids):
        issues.append(CheckIssue("splits", f"task ids are not unique across {' and '.join(splits)}"))
    for first, second in itertools.combinations(splits, 2):
        shared = {t.prompt for t in splits[first]} & {t.prompt for t in splits[second]}
        if shared:
            issues.append(CheckIssue("splits", f"{len(shared)} prompts appear in both {first} and {second}"))
    if rebuild is not None:
        again = rebuild()
        if any(list(again.tasks(s)) != splits[s] for s in splits):
            issues.append(CheckIssue("determinism", "rebuilding the factory gave different tasks"))
    return issues


def _tool_warnings(spec: ToolSpec) -> list[str]:
    """What the model will not be told: a tool without a description, parameters without one."""
    found = []
    if not spec.description.strip():
        found.append(f"tool {spec.name!r} has no description (no docstring): the model sees only its name")
    props = spec.parameters.get("properties") if isinstance(spec.parameters, dict) else None
    if isinstance(props, dict):
        bare = [name for name, p in props.items() if not (isinstance(p, dict) and p.get("description"))]
        if bare:
            names = ", ".join(map(repr, bare))
            found.append(f"tool {spec.name!r}: parameter(s) {names} have no description (add an Args: section)")
    return found


def _check_tool_spec(spec: object) -> str | None:
    if not isinstance(spec, ToolSpec):
        return f"tools must be ToolSpec, got {type(spec).__name__}"
    params = spec.parameters
    if not spec.name or not isinstance(params, dict) or params.get("type") != "object":
        return f"tool {spec.name!r}: parameters must be a JSON schema with type 'object'"
    props, required = params.get("properties", {}), params.get("required", [])
    if not isinstance(props, dict) or not isinstance(required, list) or not set(required) <= set(props):
        return f"tool {spec.name!r}: 'required' must list names from 'properties'"
    try:
        json.dumps(params)
    except (TypeError, ValueError) as e:
        return f"tool {spec.name!r}: schema is not JSON-serialisable ({e})"
    return None


Landing = Literal["error observation", "result", "masked fault", "episode end"]


@dataclass(frozen=True)
class ToolProbe:
    """Where one call with wrong arguments landed: ``landing`` and its class (the exception's type name for a
    tool that raised, ``invalid arguments`` / ``invalid JSON`` for a call the schema refused, the failure kind for
    a masked fault)."""

    tool: str
    arguments: str
    landing: Landing
    detail: str
    message: str = ""
    """The exception or failure text, where there is one."""


@dataclass(frozen=True)
class EnvCheck:
    """What :func:`acheck_report` found: the issues, and where each wrong-argument tool call landed."""

    issues: list[CheckIssue]
    probes: list[ToolProbe] = field(default_factory=list)
    train_tasks: int = 0
    """Tasks in the train split (the check drives a few of them)."""
    validation: str = ""
    """Where a run's validation split comes from: the factory's own, or carved from its train split."""

    def summary(self) -> list[str]:
        """One line per tool: how its wrong-argument calls landed, by class; then where validation comes from."""
        lines = []
        for tool in dict.fromkeys(p.tool for p in self.probes):
            mine = [p for p in self.probes if p.tool == tool]
            by: dict[str, Counter[str]] = {}
            for p in mine:
                by.setdefault(p.landing, Counter())[p.detail] += 1
            parts = [
                f"{sum(c.values())} {landing}{'s' * (sum(c.values()) > 1)}"
                + (f" ({', '.join(f'{k} ×{n}' for k, n in c.most_common())})" if landing != "result" else "")
                for landing, c in by.items()
            ]
            masked = "" if "masked fault" in by else "; none masked"
            lines.append(f"{tool}: {len(mine)} calls with wrong arguments → {', '.join(parts)}{masked}")
        return [*lines, self.validation] if self.validation else lines


def _example(schema: object) -> object:
    """A value that fits ``schema`` (a JSON schema of one parameter), to hold the other fields still while one is
    made wrong."""
    if not isinstance(schema, dict):
        return "x"
    if "default" in schema:
        return schema["default"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    if "const" in schema:
        return schema["const"]
    for union in ("anyOf", "oneOf"):
        options = [o for o in schema.get(union, []) if not (isinstance(o, dict) and o.get("type") == "null")]
        if options:
            return _example(options[0])
    examples = {"string": "x", "integer": 1, "number": 1.5, "boolean": True, "array": [], "object": {}, "null": None}
    kind = schema.get("type")
    return examples.get(kind, "x") if isinstance(kind, str) else "x"


_ODD: dict[str, tuple[object, ...]] = {
    "string": ("", "rect"),
    "integer": (0, -1, 10**30),
    "number": (0, -1, 1e308),
}
"""Schema-valid values a tool must survive: they pass validation, so only the tool's own code meets them."""


INVALID_JSON = "{not json"


def wrong_arguments(spec: ToolSpec) -> list[str]:
    """Argument JSONs a model will send sooner or later: not JSON, required fields missing, every field of the
    wrong type, and for each string or number field (the others held at a fitting value) the empty and unknown
    string, zero, a negative and a huge number."""
    props = spec.parameters.get("properties", {})
    props = props if isinstance(props, dict) else {}
    base = {name: _example(schema) for name, schema in props.items()}
    calls = [INVALID_JSON, json.dumps({name: [[]] for name in props} or {"unexpected": 1})]
    if spec.parameters.get("required"):
        calls.append("{}")
    for name, schema in props.items():
        kind = schema.get("type") if isinstance(schema, dict) else None
        if isinstance(schema, dict) and "enum" in schema:
            continue  # the schema itself refuses anything else
        calls += [json.dumps({**base, name: odd}) for odd in _ODD.get(kind if isinstance(kind, str) else "", ())]
    return calls


_RAISED = re.compile(r"\braised (\w+)")


def _landing(result: StepResult) -> tuple[Landing, str]:
    """Where a tool call's step result landed, and its class."""
    if result.failure is not None:
        return "masked fault", result.failure.kind
    if result.terminated or result.truncated:
        return "episode end", "ended the episode"
    text = result.observations[-1].content if result.observations else ""
    try:
        shown = json.loads(text)
    except ValueError:
        shown = None
    error = shown.get("error") if isinstance(shown, dict) else None
    if not isinstance(error, str) and not result.info.get("tool_error"):
        return "result", "result"
    error = error if isinstance(error, str) else text
    if (m := _RAISED.search(error)) is not None:
        return "error observation", m.group(1)
    if "not valid JSON" in error:
        return "error observation", "invalid JSON"
    if error.startswith("invalid arguments"):
        return "error observation", "invalid arguments"
    return "error observation", "error text"


async def _probe(factory: EnvFactory, task: Task, spec: ToolSpec, arguments: str) -> ToolProbe:
    """One episode whose only turn calls ``spec`` with ``arguments``."""
    call = Message("assistant", arguments, channel="commentary", recipient=f"functions.{spec.name}")
    env = factory.make(task)
    try:
        await env.reset()
        try:
            result = await env.step([call])
        finally:
            await env.close()
    except Exception as e:  # the scheduler records a raising step as a masked env_error
        return ToolProbe(spec.name, arguments, "masked fault", "env_error", f"step raised {type(e).__name__}: {e}")
    if not isinstance(result, StepResult):
        return ToolProbe(spec.name, arguments, "result", "not a StepResult")  # type: ignore[unreachable]  # a user env
    landing, detail = _landing(result)
    return ToolProbe(spec.name, arguments, landing, detail, result.failure.detail if result.failure else "")


def _probe_issue(probe: ToolProbe, task_id: str) -> CheckIssue | None:
    """An issue for a probe that landed where the model's own argument must not."""
    where = f"{probe.tool}({probe.arguments[:80]})"
    if probe.landing == "masked fault" and probe.detail == "tool_timeout":
        return CheckIssue("tools", f"{where} timed out: a masked fault the model's argument caused", task_id, "warning")
    if probe.landing == "masked fault":
        return CheckIssue(
            "tools",
            f"{where} was masked as {probe.detail} ({probe.message[:200]}): an exception on the model's own "
            "argument must reach the model as an error observation (let a Toolbox run the tool; raise ToolInfraError "
            "only for infrastructure failures), or a policy learns to trigger it to escape a low reward",
            task_id,
        )
    if probe.arguments == INVALID_JSON and probe.landing != "error observation":
        return CheckIssue(
            "episode", f"bad call to {probe.tool}: invalid JSON must give an error observation (model fault)", task_id
        )
    return None


async def _probe_tools(factory: EnvFactory, task: Task, specs: Sequence[ToolSpec]) -> list[ToolProbe]:
    return [await _probe(factory, task, spec, arguments) for spec in specs for arguments in wrong_arguments(spec)]


def _check_result(result: object, what: str) -> list[str]:
    if not isinstance(result, StepResult):
        return [f"{what}: step returned {type(result).__name__}, not StepResult"]
    problems = []
    if result.terminated and result.truncated:
        problems.append(f"{what}: terminated and truncated are both set")
    if not (math.isfinite(result.reward) and 0.0 <= result.reward <= 1.0):
        problems.append(f"{what}: reward {result.reward} outside [0, 1]")
    if any(not isinstance(v, float) for v in result.info.values()):
        problems.append(f"{what}: info values must be floats")
    if any(not isinstance(m, Message) for m in result.observations):
        problems.append(f"{what}: observations must be Messages")
    return problems


def _not_async(env: object) -> list[str]:
    """``reset``/``step``/``close`` that are plain functions: awaiting their result fails in the rollout."""
    return [
        f"{name}() must be `async def` (the rollout awaits it)"
        for name in ("reset", "step", "close")
        if callable(method := getattr(env, name, None)) and not inspect.iscoroutinefunction(method)
    ]


async def _episode(
    factory: EnvFactory, task: Task, action: Sequence[Message], label: str
) -> tuple[StepResult | None, list[str]]:
    """One scripted single-step episode; a raised exception is a problem to report, not a crash."""
    try:
        env = factory.make(task)
        first = await env.reset()
        if not isinstance(first, list) or not first or any(not isinstance(m, Message) for m in first):
            return None, [f"{label}: reset() must return a non-empty list of Messages"]
        try:
            result = await env.step(action)
        finally:
            await env.close()
    except Exception as e:
        return None, [f"{label}: raised {type(e).__name__}: {e}"]
    problems = _check_result(result, label)
    return (result if isinstance(result, StepResult) else None), problems


async def _check_task(factory: EnvFactory, task: Task, probe: bool) -> tuple[list[CheckIssue], list[ToolProbe]]:
    env = factory.make(task)
    if (problem := _env_protocol(env)) is not None:
        return [CheckIssue("protocol", problem, task.id)], []
    specs = [spec for spec in env.tools if isinstance(spec, ToolSpec)]
    warnings = [CheckIssue("tools", w, task.id, "warning") for spec in specs for w in _tool_warnings(spec)]
    # with a sync method every episode below would fail the same way: say why, once
    not_async = _not_async(env)
    problems = not_async or await _check_episodes(factory, task, env)
    probes = await _probe_tools(factory, task, specs) if probe and not not_async else []
    probed = [i for p in probes if (i := _probe_issue(p, task.id)) is not None]
    return [CheckIssue("episode", p, task.id) for p in problems] + probed + warnings, probes


async def _check_episodes(factory: EnvFactory, task: Task, env: Env) -> list[str]:
    problems: list[str] = []
    if not isinstance(env.instructions, str):
        problems.append("instructions must be a str")  # type: ignore[unreachable]  # a user's env may break types
    tools = list(env.tools)
    problems += [p for spec in tools if (p := _check_tool_spec(spec))]
    await env.close()
    rewards = []
    for label, content in (("correct final", task.answer), ("wrong final", "\x00 not an answer \x00")):
        result, found = await _episode(factory, task, [Message("assistant", content, channel="final")], label)
        problems += found
        if result is not None and not result.terminated:
            problems.append(f"{label}: a final answer must terminate the episode")
        rewards.append(result.reward if result is not None else 0.0)
    if rewards[0] < rewards[1]:
        problems.append("Task.answer as the final answer scores lower than garbage")
    return problems


async def acheck_report(
    factory: EnvFactory, n_tasks: int = 5, rebuild: Callable[[], EnvFactory] | None = None
) -> EnvCheck:
    """The issues, and where each wrong-argument tool call of the first task landed (tools are probed once:
    their code does not depend on the task)."""
    if (broken := protocol_issue(factory)) is not None:  # nothing else can be checked
        return EnvCheck([broken])
    try:
        issues = _check_splits(factory, rebuild)
        train = list(factory.tasks("train"))
        tasks = train[:n_tasks] + list(factory.tasks("test"))[:1]
    except Exception as e:  # report, don't crash: the point is to list everything that is wrong
        return EnvCheck([CheckIssue("splits", f"raised {type(e).__name__}: {e}")])
    probes: list[ToolProbe] = []
    for i, task in enumerate(tasks):
        try:
            found, probed = await _check_task(factory, task, probe=i == 0)
        except Exception as e:
            found, probed = [CheckIssue("episode", f"raised {type(e).__name__}: {e}", task.id)], []
        issues += found
        probes += probed
    return EnvCheck(dedupe(issues), probes, len(train), _validation_line(factory, train))


def _validation_line(factory: EnvFactory, train: Sequence[Task]) -> str:
    """Where a run's validation split comes from (a factory without its own is not an error: one is carved)."""
    if (why := missing_validation(factory)) is None:
        return f"validation: the factory's own split ({len(factory.tasks('validation'))} tasks)"
    rest, carved = carve_validation(train)
    return (
        f"validation: none of its own ({why}); a run carves {len(carved)} of the {len(train)} train tasks (a hash "
        f"of each prompt) as its validation split, training on the other {len(rest)} (docs/custom-env.md)"
    )


async def acheck_env(
    factory: EnvFactory, n_tasks: int = 5, rebuild: Callable[[], EnvFactory] | None = None
) -> list[CheckIssue]:
    """Async form of :func:`check_env`, for callers already inside an event loop."""
    return (await acheck_report(factory, n_tasks, rebuild)).issues


def check_env(
    factory: EnvFactory, n_tasks: int = 5, rebuild: Callable[[], EnvFactory] | None = None
) -> list[CheckIssue]:
    """Issues found, errors and warnings (empty list = clean; :func:`errors` = what fails the check).
    ``rebuild`` makes a fresh factory with the same config."""
    return asyncio.run(acheck_env(factory, n_tasks, rebuild))


def check_target(target: str, n_tasks: int = 5, kwargs: Mapping[str, object] | None = None) -> EnvCheck:
    """:func:`acheck_report` on ``MODULE:FACTORY`` or ``FILE.py:FACTORY``. A malformed target, a missing file,
    module or attribute raise :class:`~harmonyrl.envs.loader.TargetError` (one line); the user's code failing
    while it is imported or while the factory is built (a tool whose schema cannot be derived, any other
    exception) is an issue, reported like the others. ``kwargs`` go to the factory, as ``env.kwargs`` do in a run."""
    given = dict(kwargs or {})
    try:
        make = load_factory(target)
        factory = make(**given)
    except ToolSchemaError as e:
        return EnvCheck([CheckIssue("tools", str(e))])
    except TargetError:
        raise
    except Exception as e:
        return EnvCheck(
            [CheckIssue("load", f"building {target} raised {type(e).__name__}: {e}{where_in_user_code(e)}")]
        )
    return asyncio.run(acheck_report(factory, n_tasks, rebuild=lambda: make(**given)))


def assert_env_ok(factory: EnvFactory, n_tasks: int = 5, rebuild: Callable[[], EnvFactory] | None = None) -> None:
    """Raise ``AssertionError`` listing the errors, if any (warnings do not fail it)."""
    issues = errors(check_env(factory, n_tasks, rebuild))
    if issues:
        raise AssertionError("env check failed:\n" + "\n".join(f"  - {i}" for i in issues))
