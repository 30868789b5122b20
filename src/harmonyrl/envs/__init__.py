"""Environments: the Env protocol, typed tools, the env checker and built-in environments."""

from harmonyrl.envs.base import Env, EnvFactory
from harmonyrl.envs.calculator import CalculatorEnv, CalculatorFactory, calculator, expert_demo
from harmonyrl.envs.checker import CheckIssue, assert_env_ok, check_env
from harmonyrl.envs.tools import Dispatch, Tool, Toolbox, ToolOutcome, tool

__all__ = [
    "CalculatorEnv",
    "CalculatorFactory",
    "CheckIssue",
    "Dispatch",
    "Env",
    "EnvFactory",
    "Tool",
    "ToolOutcome",
    "Toolbox",
    "assert_env_ok",
    "calculator",
    "check_env",
    "expert_demo",
    "tool",
]
