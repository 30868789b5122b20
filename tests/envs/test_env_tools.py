"""Typed tools: schema derivation, the call boundary (model faults vs environment faults), the toolbox."""

from __future__ import annotations  # string annotations: schema derivation must resolve them

import asyncio
import json
import time
from typing import Literal

import pytest

from harmonyrl.envs.tools import Tool, Toolbox, ToolInfraError, declared_fault, observation, parse_docstring, tool
from harmonyrl.types import Failure, Message


def search(query: str, limit: int = 5, mode: Literal["fast", "exact"] = "fast", title: str | None = None) -> str:
    """Search the notes.

    Longer explanation that is not part of the description.

    Args:
        query (str): What to look for,
            across lines.
        limit: Maximum number of hits.
        mode: Search mode.
        title: Only notes with this title.

    Returns:
        Matching notes.
    """
    return f"{query}:{limit}:{mode}:{title}"


async def asearch(query: str, tags: list[str]) -> dict[str, object]:
    """Async search."""
    await asyncio.sleep(0)
    return {"query": query, "tags": tags}


def call(t: Tool, args: object) -> object:
    return asyncio.run(t.call(args if isinstance(args, str) else json.dumps(args)))


def test_schema_types_defaults_descriptions() -> None:
    t = tool(search)
    assert (t.name, t.description) == ("search", "Search the notes.")
    assert t.parameters == {
        "type": "object",
        "additionalProperties": False,
        "required": ["query"],
        "properties": {
            "query": {"type": "string", "description": "What to look for, across lines."},
            "limit": {"type": "integer", "default": 5, "description": "Maximum number of hits."},
            "mode": {
                "type": "string",
                "enum": ["fast", "exact"],
                "default": "fast",
                "description": "Search mode.",
            },
            # a parameter called "title" survives the stripping of pydantic's auto titles
            "title": {
                "anyOf": [{"type": "string"}, {"type": "null"}],
                "default": None,
                "description": "Only notes with this title.",
            },
        },
    }
    assert t.spec.parameters == t.parameters
    assert tool(asearch).parameters["properties"] == {
        "query": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
    }


def test_docstring_without_blank_line_or_args() -> None:
    assert parse_docstring("Add.\nArgs:\n    a: first\n") == ("Add.", {"a": "first"})
    assert parse_docstring(None) == ("", {})


def test_untyped_or_variadic_functions_are_refused() -> None:
    def untyped(x):  # type: ignore[no-untyped-def]
        return x

    def variadic(*xs: int) -> int:
        return 0

    for fn in (untyped, variadic):
        with pytest.raises(TypeError):
            tool(fn)


def test_sync_and_async_ok() -> None:
    out = call(tool(search), {"query": "q", "limit": "7"})  # lax mode: "7" is accepted as 7
    assert (out.kind, out.text, out.failure) == ("ok", "q:7:fast:None", None)
    out = call(tool(asearch), {"query": "q", "tags": ["a"]})
    assert json.loads(out.text) == {"query": "q", "tags": ["a"]}


@pytest.mark.parametrize(
    ("args", "kind", "needle"),
    [
        ("{not json", "invalid_json", "not valid JSON"),
        ("", "invalid_json", "not valid JSON"),
        ("[1, 2]", "invalid_arguments", "JSON object"),
        ({}, "invalid_arguments", "query: Field required"),
        ({"query": "q", "limit": "many"}, "invalid_arguments", "limit:"),
        ({"query": "q", "mode": "slow"}, "invalid_arguments", "mode:"),
        ({"query": "q", "bogus": 1}, "invalid_arguments", "bogus: Extra inputs"),
    ],
)
def test_model_faults_are_error_observations(args: object, kind: str, needle: str) -> None:
    out = call(tool(search), args)
    assert out.kind == kind and out.failure is None
    assert out.model_fault == "invalid_tool_args"
    assert needle in json.loads(out.text)["error"]
    assert "errors.pydantic.dev" not in out.text


def slow_sync(seconds: float) -> str:
    """Sleep."""
    time.sleep(seconds)
    return "done"


async def slow_async(seconds: float) -> str:
    """Sleep."""
    await asyncio.sleep(seconds)
    return "done"


@pytest.mark.parametrize("fn", [slow_sync, slow_async])
def test_timeout_is_an_environment_failure(fn: object) -> None:
    out = call(Tool.from_function(fn, timeout_s=0.05), {"seconds": 0.3})  # type: ignore[arg-type]
    assert out.kind == "tool_timeout" and out.text == ""
    assert out.failure is not None and out.failure.kind == "tool_timeout"
    assert out.model_fault is None


def test_sync_tools_run_off_the_event_loop() -> None:
    t = tool(slow_sync)

    async def two() -> float:
        start = time.perf_counter()
        await asyncio.gather(t.call('{"seconds": 0.2}'), t.call('{"seconds": 0.2}'))
        return time.perf_counter() - start

    assert asyncio.run(two()) < 0.35


def boom(x: int) -> str:
    """Always raises; TimeoutError from inside a tool is the tool's answer to the call, not our timeout."""
    raise TimeoutError(f"inner {x}")


def test_a_tool_raising_is_an_error_observation_not_a_masked_fault() -> None:
    out = call(tool(boom), {"x": 3})
    assert (out.kind, out.failure, out.model_fault) == ("tool_error", None, "tool_error")
    assert json.loads(out.text) == {"error": "boom raised TimeoutError: inner 3"}


def down(x: int) -> str:
    """Declares an infrastructure failure."""
    raise ToolInfraError(f"backend {x} unreachable")


def test_only_a_declared_env_fault_is_masked() -> None:
    out = call(tool(down), {"x": 2})
    assert (out.kind, out.text, out.model_fault) == ("tool_crash", "", None)
    assert out.failure == Failure("tool_crash", "down raised ToolInfraError: backend 2 unreachable")
    assert declared_fault(ToolInfraError("x", "sandbox_error")) == "sandbox_error"
    assert declared_fault(KeyError("rect")) is None


def emit(kind: str) -> object:
    """Return awkward values."""
    return {
        "big": "x" * 50,
        "bytes": b"ok \xff\xfe end",
        "surrogate": "bad \udcff char",
        "dict": {"a": [1, 2], "b": "é"},
        "none": None,
    }[kind]


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("bytes", "ok \ufffd\ufffd end"),
        ("surrogate", "bad ? char"),
        ("dict", '{"a": [1, 2], "b": "é"}'),
        ("none", "null"),
    ],
)
def test_output_becomes_safe_text(kind: str, expected: str) -> None:
    out = call(tool(emit), {"kind": kind})
    assert out.kind == "ok" and out.text == expected
    out.text.encode("utf-8")  # must not raise


def test_oversized_output_is_truncated_with_marker() -> None:
    out = call(Tool.from_function(emit, max_output_chars=10), {"kind": "big"})
    assert out.output_truncated
    assert out.text == "x" * 10 + "\n…[truncated 40 chars]"


def _call(name: str, content: str) -> Message:
    return Message(
        role="assistant",
        channel="commentary",
        recipient=f"functions.{name}",
        content_type="json",
        content=content,
    )


def test_toolbox_dispatch() -> None:
    box = Toolbox([tool(search), tool(boom)])
    assert [s.name for s in box.specs] == ["search", "boom"]
    obs, failure, kind = asyncio.run(box.dispatch(_call("search", '{"query": "q"}')))
    assert obs == Message(
        role="tool",
        name="functions.search",
        recipient="assistant",
        channel="commentary",
        content="q:5:fast:None",
    )
    assert (failure, kind) == (None, "ok")

    obs, failure, kind = asyncio.run(box.dispatch(_call("nope", "{}")))
    assert kind == "unknown_tool" and failure is None and obs is not None
    assert obs.name == "functions.nope"
    assert json.loads(obs.content)["error"] == "unknown tool 'nope'; available tools: boom, search"

    obs, failure, kind = asyncio.run(box.dispatch(_call("search", "nope")))
    assert kind == "invalid_json" and obs is not None and failure is None

    obs, failure, kind = asyncio.run(box.dispatch(_call("boom", '{"x": 1}')))
    assert kind == "tool_error" and failure is None and obs is not None
    assert json.loads(obs.content) == {"error": "boom raised TimeoutError: inner 1"}


def test_toolbox_rejects_duplicates_and_non_calls() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        Toolbox([tool(search), tool(search)])
    box = Toolbox([tool(search)])
    for msg in (
        Message("assistant", "hi", channel="final"),
        Message("assistant", "{}", recipient="browser.open"),
    ):
        assert not box.handles(msg)
        with pytest.raises(ValueError):
            asyncio.run(box.dispatch(msg))


def test_observation_shape() -> None:
    assert observation("calculator", "{}") == Message(
        role="tool", name="functions.calculator", recipient="assistant", channel="commentary", content="{}"
    )


def test_many_blocking_sync_tools_run_at_once() -> None:
    # 32 calls meet at a barrier: it only opens if all 32 run concurrently. The event loop's default executor
    # (cpu + 4 threads) would leave the barrier broken and every call would crash.
    import threading

    barrier = threading.Barrier(32, timeout=10)

    def wait_for_all(tag: str) -> str:
        """Block until 32 calls are in flight."""
        barrier.wait()
        return tag

    t = Tool.from_function(wait_for_all, timeout_s=20)

    async def main() -> list[str]:
        outs = await asyncio.gather(*(t.call(json.dumps({"tag": str(i)})) for i in range(32)))
        return [o.kind for o in outs]

    assert asyncio.run(main()) == ["ok"] * 32


class _SandboxDown(RuntimeError):
    failure_kind = "sandbox_error"


class _Bogus(RuntimeError):
    failure_kind = "the_model_did_it"  # not an environment failure kind: must not be trusted


def test_a_tool_can_classify_its_own_environment_fault() -> None:
    def flaky(x: int) -> str:
        """A tool whose backend is down.

        Args:
            x: Anything.
        """
        raise _SandboxDown("could not start")

    def odd(x: int) -> str:
        """A tool that claims an unknown kind.

        Args:
            x: Anything.
        """
        raise _Bogus("?")

    down = asyncio.run(Tool.from_function(flaky).call('{"x": 1}'))
    assert (
        down.failure is not None and down.failure.kind == "sandbox_error" and "could not start" in down.failure.detail
    )
    bogus = asyncio.run(Tool.from_function(odd).call('{"x": 1}'))  # not a declared fault: the model reads it
    assert (bogus.kind, bogus.failure, json.loads(bogus.text)) == (
        "tool_error",
        None,
        {"error": "odd raised _Bogus: ?"},
    )
