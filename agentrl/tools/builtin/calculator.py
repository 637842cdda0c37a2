"""`calculator`: safe arithmetic. The expression is parsed with Python's `ast` and evaluated node by node over
a whitelist (numbers, + - * / // % ** and ^ as power, parentheses, a few math functions and constants); nothing
is ever passed to eval, names outside the whitelist are rejected, and sizes are bounded so `9**9**9` cannot
hang the service.

The result is JSON, like the lookup tool's: `{"value": "42"}`, the number as exact decimal text (JSON numbers lose
digits past 2**53 in many parsers). A model then copies a result into its answer the way it copies any tool's
field: the value after `": "`, one learned skill for every JSON tool instead of one more per tool (with a bare
number the tiny model often never learns to copy the result's first digit; docs/benchmarks.md).
"""

from __future__ import annotations

import ast
import json
import math
import operator

from agentrl.tools.base import ToolError, tool

MAX_EXPRESSION_CHARS = 500
MAX_EXPONENT = 1000
MAX_INT_DIGITS = 300

_BINARY = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCTIONS = {
    "sqrt": math.sqrt, "exp": math.exp, "log": math.log, "log2": math.log2, "log10": math.log10,
    "sin": math.sin, "cos": math.cos, "tan": math.tan, "asin": math.asin, "acos": math.acos, "atan": math.atan,
    "abs": abs, "round": round, "floor": math.floor, "ceil": math.ceil, "min": min, "max": max,
    "factorial": math.factorial,
}
_CONSTANTS = {"pi": math.pi, "e": math.e, "tau": math.tau}


def _check_size(value: float) -> float | int:
    if isinstance(value, int) and abs(value) >= 10**MAX_INT_DIGITS:
        raise ToolError(f"result has more than {MAX_INT_DIGITS} digits")
    if isinstance(value, float) and math.isinf(value):
        raise ToolError("result is too large (overflow)")
    return value


def _eval(node: ast.AST) -> float | int:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ToolError(f"exponent {right} is too large (limit {MAX_EXPONENT})")
        try:
            return _check_size(_BINARY[type(node.op)](left, right))
        except ZeroDivisionError:
            raise ToolError("division by zero") from None
        except OverflowError:
            raise ToolError("result is too large (overflow)") from None
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.Name):
        if node.id in _CONSTANTS:
            return _CONSTANTS[node.id]
        raise ToolError(f"unknown name {node.id!r}; constants: {', '.join(_CONSTANTS)}")
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        fn = _FUNCTIONS.get(node.func.id)
        if fn is None:
            raise ToolError(f"unknown function {node.func.id!r}; functions: {', '.join(_FUNCTIONS)}")
        args = [_eval(a) for a in node.args]
        if fn is math.factorial and (not args or args[0] > 200):
            raise ToolError("factorial argument must be an integer <= 200")
        try:
            return _check_size(fn(*args))
        except (ValueError, TypeError, OverflowError) as e:
            raise ToolError(f"{node.func.id}{tuple(args)}: {e}") from None
    raise ToolError(f"unsupported syntax {ast.unparse(node)!r}: use numbers, + - * / // % ** ( ) and "
                    f"functions like sqrt(x)")


def format_number(value: float) -> str:
    """Integers exactly; floats with 12 significant digits, integral floats without a trailing .0."""
    if isinstance(value, bool):
        value = int(value)
    if isinstance(value, int):
        return str(value)
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return format(value, ".12g")


def format_result(value: float | int) -> str:
    """The calculator's answer text: `{"value": "<format_number(value)>"}`."""
    return json.dumps({"value": format_number(value)})


def result_value(text: str) -> str:
    """The number text inside a `format_result` answer."""
    return json.loads(text)["value"]


def evaluate(expression: str) -> float | int:
    """Evaluate an arithmetic expression; raises ToolError with a message for the model."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    text = expression.strip().replace("^", "**").replace("×", "*").replace("÷", "/")
    if not text:
        raise ToolError("empty expression")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as e:
        raise ToolError(f"cannot parse {expression!r}: {e.msg}") from None
    return _eval(tree)


@tool(inline=True)
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: e.g. "(3 + 4) * 12"; also // % ** sqrt log abs round min max pi e
    """
    # The schema text is part of every prompt: kept short so small models spend their context on the task.
    return format_result(evaluate(expression))


__all__ = ["calculator", "evaluate", "format_number", "format_result", "result_value"]
