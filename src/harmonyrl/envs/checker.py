"""``check_env``: contract checks a user runs on their own environment (in the spirit of Gymnasium's).

It drives a few episodes with scripted actions and reports what breaks the contract the rollout layer
relies on, as a list of issues rather than the first exception, so one run shows everything:

* protocol: the factory has ``name`` (a str), ``tasks(split)`` and ``make(task)``, and what ``make`` returns has
  ``tools``, ``instructions``, ``reset``, ``step`` and ``close`` (checked first: without them nothing else can run);
* splits: non-empty, ``Task.split`` matches, ids unique, no prompt shared by train and test;
* determinism: a second factory from ``rebuild`` yields identical tasks;
* API shape: ``reset`` returns messages, ``step`` returns a ``StepResult``, tools have object JSON schemas;
* semantics: a ``final`` answer terminates, never terminated *and* truncated, rewards finite in [0, 1],
  ``info`` values are floats, a malformed tool call is an observation (model fault), not a crash or failure;
* ``reset``/``step``/``close`` are ``async def`` (the rollout awaits them).

An issue found for several tasks is reported once, with how many tasks share it. Warnings (a tool or a
parameter the model sees no description of) are listed but do not fail the check.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from harmonyrl.envs.base import Env, EnvFactory
from harmonyrl.envs.loader import TargetError, load_factory, where_in_user_code
from harmonyrl.envs.tools import ToolSchemaError
from harmonyrl.types import Message, StepResult, Task, ToolSpec


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


def _check_splits(factory: EnvFactory, rebuild: Callable[[], EnvFactory] | None) -> list[CheckIssue]:
    issues: list[CheckIssue] = []
    splits = {s: list(factory.tasks(s)) for s in ("train", "test")}
    for split, tasks in splits.items():
        if not tasks:
            issues.append(CheckIssue("splits", f"{split} split is empty"))
        if any(not isinstance(t, Task) or t.split != split for t in tasks):
            issues.append(CheckIssue("splits", f"{split} split holds non-Task items or a wrong Task.split"))
    ids = [t.id for tasks in splits.values() for t in tasks]
    if len(set(ids)) != len(ids):
        issues.append(CheckIssue("splits", "task ids are not unique across train and test"))
    shared = {t.prompt for t in splits["train"]} & {t.prompt for t in splits["test"]}
    if shared:
        issues.append(CheckIssue("splits", f"{len(shared)} prompts appear in both train and test"))
    if rebuild is not None:
        again = rebuild()
        if any(list(again.tasks(s)) != splits[s] for s in ("train", "test")):
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


async def _check_task(factory: EnvFactory, task: Task) -> list[CheckIssue]:
    env = factory.make(task)
    if (problem := _env_protocol(env)) is not None:
        return [CheckIssue("protocol", problem, task.id)]
    specs = [spec for spec in env.tools if isinstance(spec, ToolSpec)]
    warnings = [CheckIssue("tools", w, task.id, "warning") for spec in specs for w in _tool_warnings(spec)]
    # with a sync method every episode below would fail the same way: say why, once
    problems = _not_async(env) or await _check_episodes(factory, task, env)
    return [CheckIssue("episode", p, task.id) for p in problems] + warnings


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
    for spec in tools:
        label = f"bad call to {spec.name}"
        call = Message("assistant", "{not json", channel="commentary", recipient=f"functions.{spec.name}")
        result, found = await _episode(factory, task, [call], label)
        problems += found
        if result is not None and (result.failure or result.terminated or not result.observations):
            problems.append(f"{label}: invalid JSON must give an error observation (model fault)")
    return problems


async def acheck_env(
    factory: EnvFactory, n_tasks: int = 5, rebuild: Callable[[], EnvFactory] | None = None
) -> list[CheckIssue]:
    """Async form of :func:`check_env`, for callers already inside an event loop."""
    if (broken := protocol_issue(factory)) is not None:  # nothing else can be checked
        return [broken]
    try:
        issues = _check_splits(factory, rebuild)
        tasks = list(factory.tasks("train"))[:n_tasks] + list(factory.tasks("test"))[:1]
    except Exception as e:  # report, don't crash: the point is to list everything that is wrong
        return [CheckIssue("splits", f"raised {type(e).__name__}: {e}")]
    for task in tasks:
        try:
            issues += await _check_task(factory, task)
        except Exception as e:
            issues.append(CheckIssue("episode", f"raised {type(e).__name__}: {e}", task.id))
    return dedupe(issues)


def check_env(
    factory: EnvFactory, n_tasks: int = 5, rebuild: Callable[[], EnvFactory] | None = None
) -> list[CheckIssue]:
    """Issues found, errors and warnings (empty list = clean; :func:`errors` = what fails the check).
    ``rebuild`` makes a fresh factory with the same config."""
    return asyncio.run(acheck_env(factory, n_tasks, rebuild))


def check_target(target: str, n_tasks: int = 5) -> list[CheckIssue]:
    """:func:`check_env` on ``MODULE:FACTORY`` or ``FILE.py:FACTORY``. A malformed target, a missing file,
    module or attribute raise :class:`~harmonyrl.envs.loader.TargetError` (one line); the user's code failing
    while it is imported or while the factory is built (a tool whose schema cannot be derived, any other
    exception) is an issue, reported like the others."""
    try:
        make = load_factory(target)
        factory = make()
    except ToolSchemaError as e:
        return [CheckIssue("tools", str(e))]
    except TargetError:
        raise
    except Exception as e:
        return [CheckIssue("load", f"building {target} raised {type(e).__name__}: {e}{where_in_user_code(e)}")]
    return check_env(factory, n_tasks, rebuild=make)


def assert_env_ok(factory: EnvFactory, n_tasks: int = 5, rebuild: Callable[[], EnvFactory] | None = None) -> None:
    """Raise ``AssertionError`` listing the errors, if any (warnings do not fail it)."""
    issues = errors(check_env(factory, n_tasks, rebuild))
    if issues:
        raise AssertionError("env check failed:\n" + "\n".join(f"  - {i}" for i in issues))
