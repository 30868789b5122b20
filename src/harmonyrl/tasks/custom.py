"""The user's own environment (``env.name=custom``) and expert (``sft.expert``), loaded from their code.

Everything the user's code can get wrong is a one-line :class:`~harmonyrl.envs.loader.UserCodeError` naming
the setting: a target that does not import, ``env.kwargs`` the factory does not take, an exception while it
builds or demonstrates, an env that breaks the contract ``check_env`` checks, a demonstration of the wrong shape.
"""

from __future__ import annotations

import hashlib
import inspect
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from harmonyrl.envs.base import Env, EnvFactory
from harmonyrl.envs.checker import acheck_env, errors, missing_validation, protocol_issue
from harmonyrl.envs.loader import TargetError, UserCodeError, load_callable, where_in_user_code
from harmonyrl.envs.taskfile import carve_validation
from harmonyrl.envs.tools import ToolSchemaError
from harmonyrl.types import Message, Split, Task

Expert = Callable[[Task, random.Random], list[Message]]
"""``expert(task, rng)`` → the assistant side of a demonstration (tool results included), as the built-in
experts return it."""

CHECK_TASKS = 3
"""Train tasks the pre-run ``check_env`` drives (plus one test task): enough to catch a broken contract, fast."""


def _load(target: str, setting: str) -> Callable[..., object]:
    try:
        return load_callable(target)
    except TargetError as e:
        raise UserCodeError(f"{setting} '{target}': {e}") from None
    except Exception as e:  # the user's module raised while it was imported
        raise UserCodeError(
            f"{setting} '{target}': importing it raised {type(e).__name__}: {e}{where_in_user_code(e)}"
        ) from None


def _check_kwargs(make: Callable[..., object], kwargs: Mapping[str, object], setting: str) -> None:
    """``env.kwargs`` that the factory does not take (or a required argument none gives): one line naming it."""
    try:
        signature = inspect.signature(make)
    except (TypeError, ValueError):  # no signature to read (a builtin): the call itself will tell
        return
    try:
        signature.bind(**kwargs)
        return
    except TypeError as e:
        reason = str(e)
    params = signature.parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    named = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    unknown = [k for k in kwargs if not takes_any and k not in named]
    takes = f"it takes: {', '.join(named)}" if named else "it takes no keyword arguments"
    if unknown:
        raise UserCodeError(f"env.kwargs.{unknown[0]}: {setting} takes no argument '{unknown[0]}' ({takes})")
    raise UserCodeError(f"{setting}: {reason} (give it as env.kwargs.NAME=VALUE; {takes})")


def custom_factory(target: str, kwargs: Mapping[str, object]) -> EnvFactory:
    """``target(**kwargs)``: the user's factory, built. Raises :class:`UserCodeError` (one line)."""
    setting = f"env.factory '{target}'"
    make = _load(target, "env.factory")
    _check_kwargs(make, kwargs, setting)
    try:
        factory = make(**kwargs)
    except ToolSchemaError as e:  # check_env's rule for a tool the model cannot be shown, said as check-env says it
        raise UserCodeError(f"{setting} fails check_env: tools: {e}") from None
    except Exception as e:
        raise UserCodeError(f"{setting}: building it raised {type(e).__name__}: {e}{where_in_user_code(e)}") from None
    if (broken := protocol_issue(factory)) is not None:  # before anything (HashOrdered, memory) reads it
        raise UserCodeError(f"{setting} fails check_env: {broken}")
    return cast(EnvFactory, factory)  # the rest of its contract is what check_env checks


class CarvedValidation:
    """A user's factory without a validation split of its own (:func:`~harmonyrl.envs.checker.missing_validation`),
    given one: the train tasks whose prompt falls in a fixed hash share (~10 %,
    :func:`~harmonyrl.envs.taskfile.carve_validation`) become the validation split and leave train; test is the
    factory's. Disjoint by prompt (the key ``check_env`` keeps train and test apart by), the same in every run.
    """

    def __init__(self, inner: EnvFactory) -> None:
        self.inner = inner
        self.name = inner.name
        self._train, self._validation = carve_validation(inner.tasks("train"))

    def tasks(self, split: Split) -> Sequence[Task]:
        """The rest of the user's train split, the carved validation split, or the user's test split."""
        return (
            self._train if split == "train" else self._validation if split == "validation" else self.inner.tasks(split)
        )

    def make(self, task: Task) -> Env:
        """The user's environment for ``task``."""
        return self.inner.make(task)

    def __getattr__(self, attr: str) -> Any:  # anything else (tools, the user's own fields) is the factory's
        if attr.startswith("__") or attr == "inner":  # copy/pickle probe before ``inner`` exists
            raise AttributeError(attr)
        return getattr(self.inner, attr)


def with_validation(factory: EnvFactory) -> EnvFactory:
    """``factory`` itself when it has a validation split of its own, else :class:`CarvedValidation` of it."""
    return factory if missing_validation(factory) is None else CarvedValidation(factory)


def _hash_key(task: Task) -> bytes:
    return hashlib.sha256(task.id.encode()).digest()


class HashOrdered:
    """A user's factory whose splits come in a fixed pseudo-random order: sorted by a hash of each task id.

    RL walks the train split in order and the held-out evaluation takes the first ``eval.n_tasks`` of the test
    split. A factory that lists its tasks by value (``for v in range(1, 1000)``) would otherwise make sixty RL
    steps see only the smallest values and the evaluation measure only the first slice. The hash depends on
    the ids alone, so every run (and every resume) reads the same order. Anything else is the user's factory's.
    """

    def __init__(self, inner: EnvFactory) -> None:
        self.inner = inner
        self.name = inner.name
        self._splits: dict[str, list[Task]] = {}

    def tasks(self, split: Split) -> list[Task]:
        """``split``'s tasks of the user's factory, in hash order (sorted once per split)."""
        if split not in self._splits:
            self._splits[split] = sorted(self.inner.tasks(split), key=_hash_key)
        return list(self._splits[split])

    def make(self, task: Task) -> Env:
        """The user's environment for ``task``."""
        return self.inner.make(task)

    def __getattr__(self, attr: str) -> Any:  # anything else (tools, the user's own fields) is the factory's
        if attr.startswith("__") or attr == "inner":  # copy/pickle probe before ``inner`` exists
            raise AttributeError(attr)
        return getattr(self.inner, attr)


async def require_env_ok(factory: EnvFactory, rebuild: Callable[[], EnvFactory], target: str) -> None:
    """``check_env`` on a user's factory before a run computes anything: the first broken rule as one line
    (``harmonyrl check-env`` lists them all). Warnings do not stop a run."""
    found = errors(await acheck_env(factory, CHECK_TASKS, rebuild))
    if found:
        more = f" (and {len(found) - 1} more; `harmonyrl check-env` lists them all)" if len(found) > 1 else ""
        raise UserCodeError(f"env.factory '{target}' fails check_env: {found[0]}{more}")


def _demo_problem(demo: object) -> str | None:
    """What makes ``demo`` unusable as a demonstration (None: nothing)."""
    if not isinstance(demo, list):
        return f"a {type(demo).__name__}, not a list of Messages"
    if not demo:
        return "an empty list"
    if any(not isinstance(m, Message) for m in demo):
        return "a list holding something other than harmonyrl.types.Message"
    last = demo[-1]
    if last.role != "assistant" or not (last.is_tool_call or last.channel == "final"):
        return "a demonstration that does not end with a final answer or a tool call"
    return None


def custom_expert(target: str) -> Expert:
    """The user's ``fn(task, rng) -> list[Message]``, wrapped so that an exception or a malformed demonstration
    is one line naming ``sft.expert`` and the task."""
    setting = f"sft.expert '{target}'"
    fn = _load(target, "sft.expert")
    try:
        inspect.signature(fn).bind(None, None)
    except TypeError as e:
        raise UserCodeError(f"{setting} must take (task, rng): {e}") from None
    except ValueError:  # no signature to read: the call will tell
        pass

    def expert(task: Task, rng: random.Random) -> list[Message]:
        try:
            demo = fn(task, rng)
        except Exception as e:
            where = where_in_user_code(e)
            raise UserCodeError(f"{setting} raised {type(e).__name__} on task '{task.id}': {e}{where}") from None
        problem = _demo_problem(demo)
        if problem is not None:
            raise UserCodeError(f"{setting} returned {problem} for task '{task.id}'")
        return cast(list[Message], demo)

    return expert
