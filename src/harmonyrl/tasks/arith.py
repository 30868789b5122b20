"""Exact integer arithmetic for tools: a safe evaluator (no names, no calls, bounded size) and the calculator tool.

Shared by the calculator task (its tool) and retool (its reference answers).
"""

from __future__ import annotations

import ast
import json
import operator
import warnings
from collections.abc import Callable
from fractions import Fraction

_MAX_EXPR_CHARS = 200
_MAX_EXPONENT = 64
_MAX_BITS = 1024  # |values| up to ~1e308: far beyond the tasks, small enough that no input is slow

_OPS: dict[type[ast.operator], Callable[[Fraction, Fraction], Fraction | int]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


class CalculatorError(ValueError):
    """A bad expression: the model's fault, reported to it as ``{"error": ...}``."""


def _bits(x: Fraction) -> int:
    return max(x.numerator.bit_length(), x.denominator.bit_length())


def _check_power(base: Fraction, exponent: Fraction) -> None:
    # Checked *before* computing: 9**9**9 must be refused, not attempted.
    if exponent.denominator != 1 or abs(exponent) > _MAX_EXPONENT:
        raise CalculatorError(f"exponent must be an integer with |exponent| <= {_MAX_EXPONENT}")
    if _bits(base) * abs(exponent) > _MAX_BITS:
        raise CalculatorError("result too large")


def _eval(node: ast.AST) -> Fraction:
    # Exact rationals: ``/`` must not lose digits the model is graded on.
    match node:
        case ast.Constant(value=int() as v) if not isinstance(v, bool):  # True is an int in Python
            return Fraction(v)
        case ast.Constant():
            raise CalculatorError("only integer numbers are supported")
        case ast.UnaryOp(op=ast.USub(), operand=x):
            return -_eval(x)
        case ast.UnaryOp(op=ast.UAdd(), operand=x):
            return _eval(x)
        case ast.BinOp(left=left, op=op, right=right) if type(op) in _OPS:
            a, b = _eval(left), _eval(right)
            if isinstance(op, ast.Pow):
                _check_power(a, b)
            result = Fraction(_OPS[type(op)](a, b))
            if _bits(result) > _MAX_BITS:
                raise CalculatorError("result too large")
            return result
        case _:
            raise CalculatorError(f"unsupported syntax: {type(node).__name__}")


def evaluate(expression: str) -> Fraction:
    """Safely evaluate integer arithmetic (+ - * / // % **, parentheses, unary minus). No names, no calls."""
    if len(expression) > _MAX_EXPR_CHARS:
        raise CalculatorError(f"expression longer than {_MAX_EXPR_CHARS} characters")
    try:
        with warnings.catch_warnings():  # e.g. "5and" warns before failing; the model sees the error, not stderr
            warnings.simplefilter("ignore", SyntaxWarning)
            tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise CalculatorError(f"invalid expression: {getattr(e, 'msg', None) or e}") from None
    try:
        return _eval(tree.body)
    except ZeroDivisionError:
        raise CalculatorError("division by zero") from None


def calculator(expression: str) -> str:
    """Evaluate integer arithmetic exactly.

    Args:
        expression: For example "347 * 28 + 1191".
    """
    try:
        value = evaluate(expression)
    except CalculatorError as e:
        return json.dumps({"error": str(e)})
    return json.dumps({"result": value.numerator if value.denominator == 1 else float(value)})
