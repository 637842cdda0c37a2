"""@tool: schemas from type hints and docstrings, argument validation, error kinds."""

from __future__ import annotations

import asyncio
import enum
from typing import Literal

import pydantic
import pytest

from agentrl.tools import INFRA_ERROR_KINDS, POLICY_ERROR_KINDS, ToolError, ToolInfraError, ToolResult, tool


class Unit(enum.Enum):
    celsius = "celsius"
    fahrenheit = "fahrenheit"


class Address(pydantic.BaseModel):
    city: str
    zip_code: int | None = None


@tool
def everything(text: str, n: int, x: float, flag: bool, items: list[int], unit: Unit,
               mode: Literal["fast", "slow"] = "fast", limit: int | None = None,
               address: Address | None = None, weights: dict[str, float] | None = None) -> str:
    """Exercise every argument kind.

    Args:
        text: Some text.
        n: A count.
        x: A number.
        flag: A switch.
        items: Integers.
        unit: Temperature unit.
        mode: Speed.
        limit: Optional cap.
        address: Where.
        weights: Named weights.
    """
    return f"{text}|{n}|{x}|{flag}|{items}|{unit.value}|{mode}|{limit}|{address.city if address else None}|{weights}"


def props() -> dict:
    return everything.schema()["function"]["parameters"]["properties"]


def test_schema_types_from_hints():
    schema = everything.schema()
    assert schema["type"] == "function"
    fn = schema["function"]
    assert fn["name"] == "everything" and fn["description"] == "Exercise every argument kind."
    p = props()
    assert p["text"] == {"type": "string", "description": "Some text."}
    assert p["n"]["type"] == "integer" and p["x"]["type"] == "number" and p["flag"]["type"] == "boolean"
    assert p["items"]["type"] == "array" and p["items"]["items"] == {"type": "integer"}
    assert p["unit"]["enum"] == ["celsius", "fahrenheit"]
    assert p["mode"]["enum"] == ["fast", "slow"] and p["mode"]["default"] == "fast"
    assert {"type": "null"} in p["limit"]["anyOf"] and {"type": "integer"} in p["limit"]["anyOf"]
    assert p["weights"]["anyOf"][0] == {"type": "object", "additionalProperties": {"type": "number"}}
    assert fn["parameters"]["required"] == ["text", "n", "x", "flag", "items", "unit"]


def test_nested_model_is_inlined_without_refs_or_titles():
    address = props()["address"]
    assert "$ref" not in str(everything.schema()) and "$defs" not in str(everything.schema())
    nested = next(a for a in address["anyOf"] if a.get("type") == "object")
    assert nested["properties"]["city"] == {"type": "string"} and nested["required"] == ["city"]
    assert "'title'" not in str(everything.schema())  # pydantic's auto titles are noise for the model
    assert address["description"] == "Where."


def test_valid_arguments_are_converted_for_the_function():
    result = asyncio.run(everything.invoke({"text": "a", "n": 2, "x": 1, "flag": True, "items": [1, 2],
                                            "unit": "celsius", "address": {"city": "Oslo"},
                                            "weights": {"w": 0.5}}))
    assert not result.is_error
    assert result.content == "a|2|1.0|True|[1, 2]|celsius|fast|None|Oslo|{'w': 0.5}"


@pytest.mark.parametrize("arguments, expected", [
    ({"text": "a", "n": "lots", "x": 1, "flag": True, "items": [], "unit": "celsius"}, "'n'"),
    ({"text": "a", "n": 1, "x": 1, "flag": True, "items": [], "unit": "kelvin"}, "'unit'"),
    ({"text": "a", "n": 1, "x": 1, "flag": True, "items": [], "unit": "celsius", "mode": "medium"}, "'mode'"),
    ({"text": "a", "n": 1, "x": 1, "flag": True, "items": ["x"], "unit": "celsius"}, "'items.0'"),
    ({"text": "a", "n": 1, "x": 1, "flag": True, "items": [], "unit": "celsius", "address": {}}, "address.city"),
    ({"n": 1, "x": 1, "flag": True, "items": [], "unit": "celsius"}, "missing required argument 'text'"),
    ({"text": "a", "n": 1, "x": 1, "flag": True, "items": [], "unit": "celsius", "extra": 1},
     "unexpected argument 'extra'"),
])
def test_bad_arguments_become_a_result_for_the_model(arguments, expected):
    result = asyncio.run(everything.invoke(arguments))
    assert result.error_kind == "bad_arguments" and result.is_error and not result.infra_error
    assert expected in result.content and "Expected: text: string" in result.content


def test_non_object_arguments_are_bad_arguments():
    result = asyncio.run(everything.invoke(["not", "a", "dict"]))
    assert result.error_kind == "bad_arguments" and "JSON object" in result.content


def test_async_tool_and_raised_errors():
    @tool
    async def fetch(url: str) -> dict:
        """Fetch."""
        await asyncio.sleep(0)
        if url == "crash":
            raise KeyError("cache")
        if url == "missing":
            raise ToolError("404 for missing")
        if url == "down":
            raise ToolInfraError("database unreachable", kind="unreachable")
        return {"url": url, "ok": True}

    ok = asyncio.run(fetch.invoke({"url": "a"}))
    assert ok.content == '{"url": "a", "ok": true}' and ok.latency_s >= 0
    crash = asyncio.run(fetch.invoke({"url": "crash"}))
    assert crash.error_kind == "tool_raised" and "KeyError: 'cache'" in crash.content
    missing = asyncio.run(fetch.invoke({"url": "missing"}))
    assert missing.error_kind == "tool_error" and missing.content == "Error: 404 for missing"
    down = asyncio.run(fetch.invoke({"url": "down"}))
    assert down.error_kind == "unreachable" and down.infra_error


def test_tool_timeout_is_an_infra_timeout():
    @tool(timeout_s=0.05)
    async def slow() -> str:
        """Slow."""
        await asyncio.sleep(5)
        return "done"

    result = asyncio.run(slow.invoke({}))
    assert result.error_kind == "timeout" and result.infra_error


def test_decorated_function_still_callable_and_sync_tools_run():
    @tool(name="add_numbers", description="Adds.")
    def add(a: int, b: int = 2) -> int:
        return a + b

    assert add(1, 2) == 3
    assert add.name == "add_numbers" and add.schema()["function"]["description"] == "Adds."
    assert asyncio.run(add.invoke({"a": 40})).content == "42"


def test_definition_errors_are_clear():
    with pytest.raises(TypeError, match="needs a type hint"):
        tool(lambda x: x)
    with pytest.raises(TypeError, match="no session_factory"):
        @tool
        def stateful(x: int, *, session) -> int:
            return x
    with pytest.raises(TypeError, match=r"\*args/\*\*kwargs"):
        @tool
        def variadic(*args: int) -> int:
            return 0


def test_error_kinds_split_and_wire_round_trip():
    assert POLICY_ERROR_KINDS.isdisjoint(INFRA_ERROR_KINDS)
    assert {"bad_arguments", "unknown_tool", "tool_raised", "tool_error"} == POLICY_ERROR_KINDS
    r = ToolResult.error("overloaded", "busy", attempts=3)
    assert r.is_error and r.infra_error
    back = ToolResult.from_wire(r.to_wire(), where="svc")
    assert (back.content, back.error_kind, back.metrics) == ("busy", "overloaded", {"attempts": 3})
    assert ToolResult.from_wire({"content": 3}, where="svc").error_kind == "server_error"
    assert ToolResult.from_wire({"content": "x", "error_kind": "weird"}, where="svc").error_kind == "server_error"
    assert ToolResult.from_wire({"content": "x", "is_error": True}, where="svc").error_kind == "tool_error"
    with pytest.raises(ValueError, match="error_kind"):
        ToolResult("x", error_kind="oops")


def test_google_docstring_sections_types_and_continuations():
    from agentrl.tools.base import parse_google_docstring

    description, args = parse_google_docstring('''Do a thing.

        Twice, if asked.

        Args:
            a (int): The a.
                Continued here.
            b: Has key: value inside.
            c:
                On the next line.

        Returns:
            something: not an argument.
        ''')
    assert description == "Do a thing.\n\nTwice, if asked."
    assert args == {"a": "The a. Continued here.", "b": "Has key: value inside.", "c": "On the next line."}
    assert parse_google_docstring("Only a line; mentions Args: in passing.") == (
        "Only a line; mentions Args: in passing.", {})
