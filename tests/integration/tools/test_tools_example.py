"""examples/custom_tool_service: the ~20-line service runs, is discovered from its YAML entry and answers."""

from __future__ import annotations

import importlib.util

import pytest
from helpers import REPO_ROOT, free_port, service

pytestmark = pytest.mark.slow

EXAMPLE = REPO_ROOT / "examples" / "custom_tool_service"


async def test_custom_tool_service_example():
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    spec = importlib.util.spec_from_file_location("call_tools", EXAMPLE / "call_tools.py")
    call_tools = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(call_tools)
    with service(["python", str(EXAMPLE / "my_tools.py"), "--port", str(port)], f"{url}/health"):
        lines = await call_tools.main(url)
    assert lines[0] == "tools: ['convert_length', 'add_to_cart']"
    assert lines[1] == "3.10686 mi"
    assert lines[2:] == ["1 item(s), total $3.50 (error_kind=None)", "2 item(s), total $7.50 (error_kind=None)",
                         "Error: adding cheese would exceed the budget of $10 (error_kind=tool_error)"]
