"""A verifiers ``Toolset``'s ``@vf.tool`` methods as harmonyrl function tools, served in process.

verifiers serves a toolset over MCP (HTTP, a process per server) and its chat harness advertises each tool as
``<server>_<tool>`` (bare ``<tool>`` with ``TOOL_PREFIX = None``), with the schema MCP derives from the method's
signature. Here the toolset registers on an in-process ``MCPServer`` (the same registration, so the same names,
schemas, argument validation and result conversion) and each call goes through ``MCPServer.call_tool``; the
result is the text the chat harness would put in its tool message (``mcp_content_to_chat_content``). A tool that
raises is an error observation the model reads (harmonyrl's tool rule, :mod:`harmonyrl.envs.tools`); a call
outliving ``timeout_s`` is a masked ``tool_timeout``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import pydantic

from harmonyrl.envs.tools import Tool


def _wire_name(server_name: str, tool: str) -> str:
    return f"{server_name}_{tool}" if server_name else tool


def _caller(server: Any, raw_name: str) -> Callable[..., Any]:
    async def call(**kwargs: object) -> str:
        from verifiers.v1.harnesses.utils.mcp import mcp_content_to_chat_content

        result = await server.call_tool(raw_name, kwargs)
        content = mcp_content_to_chat_content(getattr(result, "content", []))
        return content if isinstance(content, str) else json.dumps(content)

    return call


def served_tools(toolsets: Sequence[Any], timeout_s: float) -> tuple[list[Tool], list[Any]]:
    """(harmonyrl tools, their verifiers ``Tool`` declarations) for the toolsets' ``@vf.tool`` methods."""
    import verifiers.v1 as vf
    from mcp.server.mcpserver import MCPServer

    tools: list[Tool] = []
    declared: list[Any] = []
    for toolset in toolsets:
        server = MCPServer(name=toolset.server_name or type(toolset).__name__, warn_on_duplicate_tools=False)
        toolset.register(server)
        for info in server._tool_manager.list_tools():
            name = _wire_name(toolset.server_name, info.name)
            model: type[pydantic.BaseModel] = info.fn_metadata.arg_model
            description = info.description or ""
            tools.append(Tool(name, description, dict(info.parameters), _caller(server, info.name), model, timeout_s))
            declared.append(vf.Tool(name=name, description=description, parameters=dict(info.parameters)))
    return tools, declared
