"""vf_calc: multi-step arithmetic with a calculator tool (a python function), several turns: a verifiers v1
environment as its users write one.

The tool is a method of a ``vf.Toolset`` marked ``@vf.tool``; verifiers serves it over MCP to its harnesses, and
harmonyrl calls the same toolset in process (``harmonyrl.tasks.ecosystems.verifiers``).
"""

import ast
import operator
import random

import verifiers.v1 as vf

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def _value(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_value(node.left), _value(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_value(node.operand)
    raise ValueError("only integers, + - * and parentheses")


class CalcToolset(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = None  # advertise the tool as `calculate`, not `calc_toolset_calculate`

    @vf.tool
    def calculate(self, expression: str) -> str:
        """Evaluate an integer arithmetic expression with + - * and parentheses, e.g. 12 * (3 + 4)."""
        try:
            return str(_value(ast.parse(expression, mode="eval").body))
        except (SyntaxError, ValueError, RecursionError) as e:
            return f"error: {e}"


class CalcData(vf.TaskData):
    answer: str
    expression: str


class CalcTaskConfig(vf.TaskConfig):
    tools: vf.ToolsetConfig = vf.ToolsetConfig()


class CalcTask(vf.Task[CalcData, vf.State, CalcTaskConfig]):
    @classmethod
    def toolsets(cls, config: CalcTaskConfig) -> list[vf.Toolset]:
        return [CalcToolset(config.tools)]

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        """1 when the final reply is exactly the value."""
        return float(trace.last_reply.strip() == self.data.answer)

    @vf.metric
    async def tool_calls(self, trace: vf.Trace) -> float:
        return float(len(trace.tool_messages))


class CalcConfig(vf.TasksetConfig):
    num_tasks: int = 2000
    seed: int = 0
    task: CalcTaskConfig = CalcTaskConfig()


class CalcTaskset(vf.Taskset[CalcTask, CalcConfig]):
    def load(self) -> list[CalcTask]:
        rng = random.Random(self.config.seed)
        tasks, seen = [], set()
        while len(tasks) < self.config.num_tasks:
            a, b, c = rng.randint(10, 99), rng.randint(2, 9), rng.randint(10, 99)
            if (a, b, c) in seen:
                continue
            seen.add((a, b, c))
            expression = f"{a} * {b} + {c}"
            data = CalcData(
                prompt=f"What is {expression}?",
                system_prompt="Use the calculate tool, then reply with only the number.",
                answer=str(a * b + c),
                expression=expression,
            )
            tasks.append(CalcTask(data, self.config.task))
        return tasks


__all__ = ["CalcTaskset"]
