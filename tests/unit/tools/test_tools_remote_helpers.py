"""Pure pieces of the HTTP path: schema checks, serve specs, idle-session sweeping."""

from __future__ import annotations

import asyncio

import pytest

from agentrl.errors import UserError
from agentrl.tools import ToolServiceError, tool
from agentrl.tools.cli import load_tool_spec
from agentrl.tools.remote import check_schemas
from agentrl.tools.toolset import ToolSet


@pytest.mark.parametrize("schemas, message", [
    ({"tools": []}, "JSON list"),
    (["calculator"], "schema #0"),
    ([{"type": "function", "function": {"description": "x"}}], "no function.name"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}], "'f'.*type.*object"),
])
def test_invalid_schemas_name_the_service(schemas, message):
    with pytest.raises(ToolServiceError, match=f"svc at x.*{message}|svc at x: .*{message}"):
        check_schemas(schemas, "svc at x")


def test_valid_schema_list_passes():
    ok = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    assert check_schemas(ok, "svc") == ok


def test_load_tool_spec_module_and_file(tmp_path):
    (calc,) = load_tool_spec("agentrl.tools.builtin.calculator:calculator")
    assert calc.name == "calculator"
    src = tmp_path / "mine.py"
    src.write_text("def double(x: int) -> int:\n    return 2 * x\n\ndef half(x: int) -> float:\n    return x / 2\n")
    assert [f.__name__ for f in load_tool_spec(f"{src}:double,half")] == ["double", "half"]
    with pytest.raises(UserError, match="has no 'triple'.*double"):
        load_tool_spec(f"{src}:triple")
    with pytest.raises(UserError, match="must look like"):
        load_tool_spec("agentrl.tools.builtin.calculator")
    with pytest.raises(UserError, match="cannot import"):
        load_tool_spec("no_such_module_xyz:f")


class Handle:
    released = 0

    def close(self) -> None:
        Handle.released += 1


@tool(session_factory=Handle)
def touch(*, session: Handle) -> str:
    """Touch the session."""
    return "touched"


async def test_idle_sessions_are_swept_and_unused_ones_cost_nothing():
    Handle.released = 0
    tools = ToolSet([touch], idle_ttl_s=0.05)
    used = tools.open_session()
    tools.open_session()  # never used: must be swept all the same
    assert (await tools.call("touch", {}, used)).content == "touched"
    assert await tools.sweep_idle() == 0
    await asyncio.sleep(0.1)
    assert await tools.sweep_idle() == 2 and tools.sessions == {}
    assert Handle.released == 1  # only the session that built a state had one to release
    assert not await tools.close_session(used)  # closing twice is harmless
