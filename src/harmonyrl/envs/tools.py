"""Tools are typed Python functions; their harmony declaration is derived, never written by hand.

    def calculator(expression: str) -> str:
        '''Evaluate an arithmetic expression.

        Args:
            expression: Integer arithmetic, e.g. "347 * 28 + 1191".
        '''

    calc = tool(calculator)                      # or Tool.from_function(calculator, timeout_s=2.0)
    outcome = await calc.call('{"expression": "1 + 2"}')

The call boundary is the one place where exceptions are turned into values, and it decides who is to blame
(invariant 5 of the architecture). The rule, for every tool and every env built on :class:`Toolbox`:

* whatever the model's call caused is an **error observation** the model reads: invalid JSON, arguments that do
  not fit the schema, an unknown tool (``invalid_json``, ``invalid_arguments``, ``unknown_tool``), and any
  exception the tool raises while handling the arguments (``tool_error``, e.g. ``KeyError: 'rect'`` for a unit
  it does not know, shown as ``{"error": "convert raised KeyError: 'rect'"}``). The turn goes on and the episode is
  graded as usual. Masking these instead would hand the policy a button: an episode heading for a 0 could escape
  it by making a tool raise.
* only what says nothing about the model is an **environment fault**, a :class:`~harmonyrl.types.Failure` that
  masks the episode (never scored as a wrong answer): the call outliving its ``timeout_s`` (``tool_timeout``),
  and an exception that declares itself one, :class:`ToolInfraError` (``tool_crash`` unless it names another kind,
  e.g. ``sandbox_error``). Any exception whose ``failure_kind`` attribute names an environment fault kind counts
  as declared: that is how the sandbox layer, which imports nothing from the rest, says its process could not
  start. Injected faults (:mod:`harmonyrl.envs.faults`) and the env's own ``reset``/``step``/``close`` raising are
  environment faults too, decided outside this module.

Sync tools run in a worker thread of :data:`TOOL_THREADS` so other episodes keep generating. That pool is
the tools' own, not the event loop's default executor: the default has only ``cpu + 4`` threads, which
would queue slow tool calls behind each other (6 at a time on a 2-core machine). A timed-out sync tool
cannot be killed: its thread runs to completion in the background. Tools that may hang for good belong in
a subprocess sandbox, not here.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import itertools
import json
import re
import time
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, cast

import pydantic
import pydantic_core

from harmonyrl.types import Failure, FailureKind, Message, ModelFaultKind, ToolSpec, is_env_failure_kind

TOOL_THREADS = ThreadPoolExecutor(max_workers=512, thread_name_prefix="harmonyrl-tool")
"""Threads for sync tools. Threads start lazily, so the size is a ceiling on concurrent blocking calls
(one per in-flight episode is plenty), not a cost paid up front."""

NAMESPACE = "functions"
OutcomeKind = Literal[
    "ok", "invalid_json", "invalid_arguments", "unknown_tool", "tool_error", "tool_timeout", "tool_crash"
]
# The finer outcome kinds map onto the coarser shared vocabulary of types.py.
_MODEL_FAULTS: dict[str, ModelFaultKind] = {
    "invalid_json": "invalid_tool_args",
    "invalid_arguments": "invalid_tool_args",
    "unknown_tool": "unknown_tool",
    "tool_error": "tool_error",
}
_MAX_DETAIL_CHARS = 500


@dataclass(frozen=True)
class ToolOutcome:
    """Result of one tool call. ``text`` is what the model sees (empty for environment faults, whose ``failure``
    is set)."""

    kind: OutcomeKind
    text: str
    failure: Failure | None = None
    elapsed_s: float = 0.0
    output_truncated: bool = False

    @property
    def model_fault(self) -> ModelFaultKind | None:
        return _MODEL_FAULTS.get(self.kind)


def error_text(message: str) -> str:
    """Error observations are JSON, like successful results, so the model sees one format."""
    return json.dumps({"error": message})


def safe_text(value: object) -> str:
    """Turn any tool return value into text that is valid UTF-8 (the tokenizer must never choke on it)."""
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", errors="replace")
    if not isinstance(value, str):
        # Structured results are shown as JSON with default separators, matching what the model writes.
        try:
            jsonable = pydantic_core.to_jsonable_python(value, fallback=repr)
        except UnicodeDecodeError:  # bytes inside that are not UTF-8 text: shown as base64, JSON's form for binary
            jsonable = pydantic_core.to_jsonable_python(value, fallback=repr, bytes_mode="base64")
        value = json.dumps(jsonable, ensure_ascii=False)
    # Lone surrogates (e.g. from os.fsdecode of bad bytes) are legal in str but not encodable as UTF-8.
    return value.encode("utf-8", errors="replace").decode("utf-8")


def truncate(text: str, max_chars: int) -> tuple[str, bool]:
    if len(text) <= max_chars:
        return text, False
    return f"{text[:max_chars]}\n…[truncated {len(text) - max_chars} chars]", True


def observation(tool_name: str, text: str) -> Message:
    """The message a tool result is appended as; shared with scripted demos so both render identically."""
    return Message(
        role="tool",
        name=f"{NAMESPACE}.{tool_name}",
        recipient="assistant",
        channel="commentary",
        content=text,
    )


_SECTION = re.compile(r"(Args|Arguments|Parameters):")
_PARAM = re.compile(r"(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """(first paragraph joined into one line, {param: description}) from a Google-style docstring."""
    lines = inspect.cleandoc(doc or "").splitlines()
    first = itertools.takewhile(lambda s: s and not _SECTION.fullmatch(s), (x.strip() for x in lines))
    params: dict[str, str] = {}
    header: int | None = None  # indent of "Args:" while inside that section
    entry: int | None = None  # indent of the parameter lines (continuations are deeper)
    current: str | None = None
    for line in lines:
        text, indent = line.strip(), len(line) - len(line.lstrip())
        if not text:
            continue
        if _SECTION.fullmatch(text):
            header, entry, current = indent, None, None
        elif header is None:
            continue
        elif indent <= header:  # the next section ("Returns:", ...) ends Args
            header = None
        elif (m := _PARAM.fullmatch(text)) and (entry is None or indent <= entry):
            entry, current = indent, m.group(1).lstrip("*")
            params[current] = m.group(2).strip()
        elif current is not None:
            params[current] = f"{params[current]} {text}".strip()
    return " ".join(first), params


def _strip_titles(schema: object, in_properties: bool = False) -> object:
    """Drop pydantic's auto-generated ``title`` keys: noise in the declaration the model reads."""
    if isinstance(schema, list):
        return [_strip_titles(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    if in_properties:  # keys here are parameter names (one may well be called "title")
        return {k: _strip_titles(v) for k, v in schema.items()}
    return {k: _strip_titles(v, in_properties=k in ("properties", "$defs")) for k, v in schema.items() if k != "title"}


class ToolSchemaError(TypeError):
    """A function that cannot be a tool: the JSON schema the model reads cannot be derived from its signature.
    The message is one line naming the tool and the parameter."""


def _arguments_model(fn: Callable[..., object], docs: dict[str, str]) -> type[pydantic.BaseModel]:
    try:
        hints = inspect.get_annotations(fn, eval_str=True)
    except NameError as e:  # a string annotation naming something not importable where ``fn`` was defined
        raise ToolSchemaError(f"tool {fn.__name__!r}: cannot resolve its type annotations ({e})") from e
    fields: dict[str, Any] = {}
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
            raise ToolSchemaError(f"tool {fn.__name__!r}: parameter {p.name!r} must be a named keyword argument")
        if p.name not in hints:
            raise ToolSchemaError(
                f"tool {fn.__name__!r}: parameter {p.name!r} needs a type annotation (its JSON schema comes from it)"
            )
        default = ... if p.default is p.empty else p.default
        fields[p.name] = (hints[p.name], pydantic.Field(default, description=docs.get(p.name)))
    return pydantic.create_model(f"{fn.__name__}_arguments", __config__=pydantic.ConfigDict(extra="forbid"), **fields)


def _schema_error(fn: Callable[..., object], error: Exception) -> ToolSchemaError:
    """Name the parameter whose annotation pydantic cannot turn into a JSON schema (only on failure: slow)."""
    hints = inspect.get_annotations(fn, eval_str=True)
    for name in inspect.signature(fn).parameters:
        try:
            pydantic.TypeAdapter(hints[name]).json_schema()
        except Exception:
            shown = getattr(hints[name], "__name__", repr(hints[name]))
            return ToolSchemaError(
                f"tool {fn.__name__!r}: parameter {name!r}: type {shown!r} has no JSON schema "
                "(use str, int, float, bool, Literal, lists, dicts or pydantic models)"
            )
    return ToolSchemaError(f"tool {fn.__name__!r}: no JSON schema: {str(error).splitlines()[0]}")


class ToolInfraError(Exception):
    """Raised by a tool to declare that the *environment* failed, not the model's call: a backend that is down, a
    worker that died, a resource that could not be had. The episode is masked (``Failure(kind, message)``), never
    scored. Raise it only for what says nothing about the model's arguments: any other exception is shown to the
    model as an error observation (see the module docstring), and a fault the model's arguments can trigger is
    a way out of a low reward that a policy will find.

        try:
            rows = backend.query(sql)
        except ConnectionError as e:
            raise ToolInfraError(f"database unreachable: {e}") from e
    """

    def __init__(self, message: str, kind: FailureKind = "tool_crash") -> None:
        super().__init__(message)
        self.failure_kind: FailureKind = kind


def declared_fault(error: BaseException) -> FailureKind | None:
    """The environment fault kind ``error`` declares (an :class:`ToolInfraError`, or any exception whose
    ``failure_kind`` names a kind of :data:`~harmonyrl.types.FailureKind`), else None: the model's to read."""
    kind = getattr(error, "failure_kind", None)
    return kind if is_env_failure_kind(kind) else None


class _Raised(NamedTuple):
    """A tool's own exception, carried out of ``wait_for`` so it is never confused with our timeout."""

    error: Exception


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, object]
    fn: Callable[..., object]
    arguments: type[pydantic.BaseModel]
    timeout_s: float = 10.0
    max_output_chars: int = 4000

    @classmethod
    def from_function(cls, fn: Callable[..., object], *, timeout_s: float = 10.0, max_output_chars: int = 4000) -> Tool:
        if timeout_s <= 0 or max_output_chars <= 0:
            raise ValueError("timeout_s and max_output_chars must be positive")
        description, docs = parse_docstring(fn.__doc__)
        try:
            model = _arguments_model(fn, docs)
            schema = cast(dict[str, object], _strip_titles(model.model_json_schema()))
        except ToolSchemaError:
            raise
        except (pydantic.PydanticUserError, pydantic_core.SchemaError, TypeError) as e:
            raise _schema_error(fn, e) from e
        return cls(fn.__name__, description, schema, fn, model, timeout_s, max_output_chars)

    @property
    def spec(self) -> ToolSpec:
        return ToolSpec(name=self.name, description=self.description, parameters=self.parameters)

    async def call(self, arguments_json: str) -> ToolOutcome:
        start = time.perf_counter()
        try:
            raw = json.loads(arguments_json)
        except (ValueError, RecursionError) as e:  # ValueError: JSONDecodeError, or an int past 4300 digits
            return ToolOutcome("invalid_json", error_text(f"arguments are not valid JSON: {e}"))
        if not isinstance(raw, dict):
            return ToolOutcome("invalid_arguments", error_text("arguments must be a JSON object"))
        try:
            args = self.arguments.model_validate(raw)
        except pydantic.ValidationError as e:
            return ToolOutcome("invalid_arguments", error_text(_format_validation(e)))
        kwargs = {name: getattr(args, name) for name in self.arguments.model_fields}
        try:
            result = await asyncio.wait_for(self._run(kwargs), self.timeout_s)
        except TimeoutError:
            failure = Failure("tool_timeout", f"{self.name} exceeded {self.timeout_s:g}s")
            return ToolOutcome("tool_timeout", "", failure, time.perf_counter() - start)
        elapsed = time.perf_counter() - start
        if isinstance(result, _Raised):
            detail = f"{self.name} raised {type(result.error).__name__}: {result.error}"[:_MAX_DETAIL_CHARS]
            if (kind := declared_fault(result.error)) is not None:
                return ToolOutcome("tool_crash", "", Failure(kind, detail), elapsed)
            return ToolOutcome("tool_error", error_text(detail), None, elapsed)
        text, cut = truncate(result, self.max_output_chars)
        return ToolOutcome("ok", text, None, elapsed, cut)

    async def _run(self, kwargs: dict[str, object]) -> str | _Raised:
        try:
            if inspect.iscoroutinefunction(self.fn):
                value = await cast(Callable[..., Awaitable[object]], self.fn)(**kwargs)
            else:
                loop = asyncio.get_running_loop()
                value = await loop.run_in_executor(TOOL_THREADS, functools.partial(self.fn, **kwargs))
            return safe_text(value)  # conversion can raise too (a broken __repr__): still the tool's fault
        except Exception as e:  # the tool boundary: any tool exception is a value from here on (see ``call``)
            return _Raised(e)


def tool(fn: Callable[..., object]) -> Tool:
    """``@tool`` with default limits; use :meth:`Tool.from_function` to set ``timeout_s`` etc."""
    return Tool.from_function(fn)


def _format_validation(e: pydantic.ValidationError) -> str:
    # Without URLs / input echo: the model reads this, so keep it short and to the point.
    parts = [
        f"{'.'.join(str(x) for x in err['loc']) or 'arguments'}: {err['msg']}" for err in e.errors(include_url=False)
    ]
    return "invalid arguments: " + "; ".join(parts)


class Dispatch(NamedTuple):
    """What :meth:`Toolbox.dispatch` returns: exactly one of observation / failure is set."""

    observation: Message | None
    failure: Failure | None
    kind: OutcomeKind


class Toolbox:
    """Tools by name; routes a tool-call message to the right tool and wraps the outcome."""

    def __init__(self, tools: Iterable[Tool]) -> None:
        self._tools: dict[str, Tool] = {}
        for t in tools:
            if t.name in self._tools:
                raise ValueError(f"duplicate tool name {t.name!r}")
            self._tools[t.name] = t

    @property
    def specs(self) -> list[ToolSpec]:
        return [t.spec for t in self._tools.values()]

    def handles(self, message: Message) -> bool:
        """True for any call into the ``functions`` namespace (known or not: unknown is a model fault)."""
        return message.is_tool_call and (message.recipient or "").startswith(f"{NAMESPACE}.")

    async def dispatch(self, message: Message) -> Dispatch:
        if not self.handles(message):
            raise ValueError(f"not a call into {NAMESPACE}.*: recipient={message.recipient!r}")
        name = cast(str, message.tool_name)
        t = self._tools.get(name)
        if t is None:
            known = ", ".join(sorted(self._tools)) or "none"
            text = error_text(f"unknown tool {name!r}; available tools: {known}")
            return Dispatch(observation(name, text), None, "unknown_tool")
        outcome = await t.call(message.content)
        if outcome.failure is not None:
            return Dispatch(None, outcome.failure, outcome.kind)
        return Dispatch(observation(name, outcome.text), None, outcome.kind)
