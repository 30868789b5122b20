"""Environments: the Env protocol, typed tools, turns, faults, memory, task files and the env checker.

The built-in environments live in :mod:`harmonyrl.tasks`."""

from harmonyrl.envs.base import Env, EnvFactory
from harmonyrl.envs.checker import CheckIssue, assert_env_ok, check_env
from harmonyrl.envs.tools import Dispatch, Tool, Toolbox, ToolInfraError, ToolOutcome, tool

__all__ = [
    "CheckIssue",
    "Dispatch",
    "Env",
    "EnvFactory",
    "Tool",
    "ToolInfraError",
    "ToolOutcome",
    "Toolbox",
    "assert_env_ok",
    "check_env",
    "tool",
]
