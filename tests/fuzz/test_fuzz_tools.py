"""Fuzzed tool-call boundary: random and adversarial JSON as the arguments of every bundled tool, through the
env's own ``step`` as the rollout calls it.

Property: the step returns a :class:`StepResult` with an observation the model reads (its error, when the arguments
are wrong), never an exception and never an environment failure. The arguments are the model's own output, so
nothing in them can be the environment's fault: a bundled tool that crashes or gives up on them would mask the
episode (a model fault taken for the env's) or, escaping ``step``, be counted as an env error. Covered: every tool of
every bundled env (``calculator``, ``sql``, ``browse``, ``maze``, ``instruct`` (none: an ``unknown_tool``), the relay
executor's calculator, the ``remember`` / ``recall`` notes tools, and the sandboxed ``python`` tool of ``retool``
and ``humaneval``, which runs a few examples only since each is a sandboxed process).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzz_settings import fuzz
from harmonyrl.envs.base import Env, EnvFactory
from harmonyrl.envs.tools import Tool
from harmonyrl.tasks.config import (
    BrowseEnvConfig,
    CalculatorEnvConfig,
    EnvConfig,
    HumanEvalEnvConfig,
    InstructEnvConfig,
    MazeEnvConfig,
    RelayEnvConfig,
    RetoolEnvConfig,
    SqlEnvConfig,
)
from harmonyrl.tasks.factory import make_factory
from harmonyrl.types import Message, StepResult, ToolSpec


@dataclass(frozen=True)
class Bundled:
    config: EnvConfig
    examples: int
    """Fuzzed examples per tool; a sandboxed process per example makes the python tool's few."""
    executor: bool = False
    """Drive the relay team's executor (the role with the tool) instead of the planner."""


SMALL = {"n_train": 4, "n_test": 2}
ENVS: dict[str, Bundled] = {
    "calculator": Bundled(CalculatorEnvConfig(**SMALL), 60),
    "calculator+memory": Bundled(CalculatorEnvConfig(**SMALL, memory=True), 40),
    "sql": Bundled(SqlEnvConfig(**SMALL), 60),
    "browse": Bundled(BrowseEnvConfig(**SMALL), 60),
    "maze": Bundled(MazeEnvConfig(**SMALL), 60),
    "instruct": Bundled(InstructEnvConfig(**SMALL), 15),
    "relay executor": Bundled(RelayEnvConfig(**SMALL), 30, executor=True),
    "retool": Bundled(RetoolEnvConfig(**SMALL), 6),
    "humaneval": Bundled(HumanEvalEnvConfig(n_train=2, n_test=1), 4),
}
SANDBOXED = ("retool", "humaneval")

_factories: dict[str, EnvFactory] = {}


def _factory(name: str) -> EnvFactory:
    if name not in _factories:
        _factories[name] = make_factory(ENVS[name].config, seed=0)
    return _factories[name]


def _make(name: str) -> Env:
    factory = _factory(name)
    task = factory.tasks("train")[0]
    if ENVS[name].executor:
        return factory.make_executor(task)  # type: ignore[attr-defined, no-any-return]  # the team factory's
    return factory.make(task)


def _specs(name: str) -> list[ToolSpec]:
    specs = list(_make(name).tools)
    return specs or [ToolSpec("search", "A tool this env does not have.", {"type": "object", "properties": {}})]


def _step(name: str, tool: str, arguments: str) -> StepResult:
    async def episode() -> StepResult:
        env = _make(name)
        await env.reset()
        try:
            call = Message("assistant", arguments, "commentary", f"functions.{tool}", content_type="json")
            return await env.step([call])
        finally:
            await env.close()

    return asyncio.run(episode())


def _assert_model_side(result: StepResult, arguments: str) -> None:
    shown = arguments if len(arguments) < 200 else f"{arguments[:200]}... ({len(arguments)} chars)"
    assert isinstance(result, StepResult)
    assert result.failure is None, (shown, result.failure)  # the model's arguments are never the env's fault
    assert result.observations or result.terminated or result.truncated, shown
    for obs in result.observations:
        obs.content.encode("utf-8")  # what the model reads next is valid text: it is rendered and tokenised


# ---- arguments ------------------------------------------------------------------------------------------------

_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),  # surrogates included: JSON carries them as \ud800 escapes
)
_json = st.recursive(_leaf, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                     max_size=4), max_leaves=12)  # fmt: skip


def _typed(schema: object) -> st.SearchStrategy[Any]:
    """A value of the type ``schema`` asks for, from its odd corners (or anything at all)."""
    kind = schema.get("type") if isinstance(schema, dict) else None
    enum = schema.get("enum") if isinstance(schema, dict) else None
    if enum:
        return st.sampled_from(enum) | st.text(max_size=10)
    if kind == "string":  # text, and text behind what a tool checks first (a query's leading SELECT)
        hostile = st.sampled_from(["", " ", "\x00", "\ud800", "<|call|>", "SELECT 1;", "1" * 5000])
        return st.text(max_size=60) | hostile | st.builds("SELECT {}".format, st.text(max_size=30) | hostile)
    if kind == "integer":
        return st.integers() | st.sampled_from([-1, 0, 2**63, -(2**63) - 1, 10**40])
    return _json


@st.composite
def _arguments(draw: st.DrawFn, spec: ToolSpec) -> str:
    """Arguments text: mostly a JSON object over the tool's parameters (typed or not, keys dropped or added),
    sometimes any JSON or any text at all."""
    shape = draw(st.sampled_from(["object", "object", "object", "json", "text"]))
    if shape == "text":
        return draw(st.text(max_size=80))
    if shape == "json":
        return json.dumps(draw(_json))
    props = spec.parameters.get("properties", {})
    assert isinstance(props, dict)
    args: dict[str, object] = {}
    for key, schema in props.items():
        if draw(st.integers(0, 5)) > 0:  # sometimes a required key is missing
            args[key] = draw(_typed(schema) if draw(st.booleans()) else _json)
    if draw(st.integers(0, 4)) == 0:
        args[draw(st.text(max_size=8))] = draw(_json)  # an extra key
    return json.dumps(args, ensure_ascii=draw(st.booleans())).encode("utf-8", "replace").decode("utf-8")


def _tool_cases(names: tuple[str, ...]) -> Iterator[tuple[str, str]]:
    for name in names:
        for spec in _specs(name):
            yield name, spec.name


FAST = tuple(n for n in ENVS if n not in SANDBOXED)


@pytest.mark.parametrize(("env", "tool"), list(_tool_cases(FAST)))
def test_random_json_arguments_are_the_models_error_never_the_envs(env: str, tool: str) -> None:
    spec = next(s for s in _specs(env) if s.name == tool)

    @fuzz(ENVS[env].examples)
    @given(arguments=_arguments(spec))
    def check(arguments: str) -> None:
        _assert_model_side(_step(env, tool, arguments), arguments)

    check()


# ---- adversarial arguments, stated -------------------------------------------------------------------------------


def _adversarial(spec: ToolSpec) -> Iterator[str]:
    """Arguments text built to break a parser or a tool: for each parameter in turn, every hostile value; then
    whole bodies that are not an object of parameters at all."""
    props = spec.parameters.get("properties", {})
    assert isinstance(props, dict)
    base = {k: ("north" if "enum" in s else 0 if s.get("type") == "integer" else "1") for k, s in props.items()}
    hostile = [
        "1" * 5000,  # an integer beyond Python's int-from-text limit (4300 digits)
        "1e400", "-1e400", "NaN", "Infinity", "-Infinity", "-0", "1.5",
        "[" * 50_000 + "]" * 50_000,  # nested past the JSON decoder's recursion limit
        "[" * 500 + "]" * 500,  # nested, but decodable
        '{"a": ' * 200 + "1" + "}" * 200,
        '"\\ud800"', '"\\udfff\\ud800x"', '"\\u0000"', '"a\\u0000b"', '"<|call|><|start|>"',
        '"SELECT \'\\ud800\'"', '"SELECT 1\\u0000"', '"1 + \\ud800"',  # past a tool's first check
        '"' + "x" * 1_000_000 + '"',  # a megabyte of text
        "null", "true", "[]", "{}", '"north"', "18446744073709551616",
    ]  # fmt: skip
    for key in props:
        for value in hostile:
            yield "{" + ", ".join(f"{json.dumps(k)}: {value if k == key else json.dumps(v)}"
                                  for k, v in base.items()) + "}"  # fmt: skip
    if props:
        key = next(iter(props))
        yield "{" + f'{json.dumps(key)}: 1, {json.dumps(key)}: "x", {json.dumps(key)}: {json.dumps(base[key])}' + "}"
    yield from ("", "{", "[", "nul", "[1, 2]", '"args"', "1" * 5000, "1e400", "NaN", "[" * 50_000,
                json.dumps({**base, "extra": 1}), "{}", "\ufeff{}", "{'single': 'quotes'}")  # fmt: skip


@pytest.mark.parametrize(("env", "tool"), list(_tool_cases(FAST)))
def test_adversarial_json_arguments_are_the_models_error_never_the_envs(env: str, tool: str) -> None:
    spec = next(s for s in _specs(env) if s.name == tool)
    for arguments in _adversarial(spec):
        _assert_model_side(_step(env, tool, arguments), arguments)


HOSTILE_PROGRAMS = (
    "import sys; sys.stdout.buffer.write(bytes(range(256)) * 64)",  # output that is not UTF-8
    "print('\\ud800')",  # a lone surrogate the program cannot even print
    "print('<|call|><|start|>assistant' * 3000)",  # control-token look-alikes, past the output cap
    "import os; os.write(2, b'\\xff' * 100000)",
)


@pytest.mark.parametrize("env", SANDBOXED)
def test_the_sandboxed_python_tool_takes_random_and_adversarial_arguments(env: str) -> None:
    """A few examples only, since the programs that validate run a sandboxed process each: random text as the
    program (mostly a syntax error in the sandbox), hostile programs, and hostile JSON."""
    spec = _specs(env)[0]
    program = st.text(max_size=40) | st.sampled_from(HOSTILE_PROGRAMS)
    arguments = st.fixed_dictionaries({"code": program}, optional={"stdin": st.text(max_size=20)}).map(json.dumps)

    @fuzz(ENVS[env].examples)
    @given(arguments=arguments | _arguments(spec))
    def check(arguments: str) -> None:
        _assert_model_side(_step(env, spec.name, arguments), arguments)

    check()
    for body in ('{"code": ' + "1" * 5000 + "}", '{"code": NaN}', "[" * 50_000, '{"code": "\\ud800"}',
                 '{"code": "print(1)", "stdin": "\\udfff"}', '{"code": "\\u0000"}'):  # fmt: skip
        _assert_model_side(_step(env, spec.name, body), body)


# ---- the Tool boundary itself -------------------------------------------------------------------------------------


def _probe(text: str, n: int = 0) -> str:
    """A tool that takes a string and an int and returns what it got.

    Args:
        text: Any text.
        n: Any integer.
    """
    return json.dumps({"len": len(text), "n": n})


HOSTILE_BODIES: list[tuple[str, str]] = [
    ('{"text": "a", "n": ' + "1" * 5000 + "}", "invalid_json"),  # regression: ValueError escaped Tool.call
    ("1" * 5000, "invalid_json"),
    ("[" * 50_000, "invalid_json"),
    ('{"text": "a", "n": 1e400}', "invalid_arguments"),
    ('{"text": NaN}', "invalid_arguments"),
    ('{"text": "\\ud800"}', "ok"),
    ('{"text": "a", "text": 3}', "invalid_arguments"),  # the last duplicate wins, as in json.loads
    ('{"text": "a", "extra": 1}', "invalid_arguments"),
]


@pytest.mark.parametrize(("body", "kind"), HOSTILE_BODIES, ids=[str(i) for i in range(len(HOSTILE_BODIES))])
def test_hostile_json_at_the_tool_boundary_is_a_model_fault_with_a_message(body: str, kind: str) -> None:
    outcome = asyncio.run(Tool.from_function(_probe).call(body))
    assert (outcome.kind, outcome.failure) == (kind, None), outcome
    if kind != "ok":
        assert outcome.model_fault is not None and json.loads(outcome.text)["error"]


def test_a_query_holding_a_lone_surrogate_is_the_models_error() -> None:
    """Regression (found by the fuzzer, ``{"sql": "SELECT \\ud800"}``): SQLite cannot take the str, the tool raised
    ``UnicodeEncodeError`` and the episode was masked as a ``tool_crash``: the model's junk taken for the env's."""
    result = _step("sql", "query", '{"sql": "SELECT \'\\ud800\'"}')
    assert result.failure is None
    assert "not valid text" in json.loads(result.observations[0].content)["error"]
