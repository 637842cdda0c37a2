"""ToolRegistry with in-process tools: routing, sessions, limits, output caps, config loading."""

from __future__ import annotations

import asyncio
import json

import pytest

from agentrl.config import ConfigError, load_config
from agentrl.errors import UserError
from agentrl.tools import ToolRegistry, ToolsConfig, tool
from agentrl.tools.builtin.calculator import calculator

IN_FLIGHT = {"now": 0, "max": 0}


@tool
async def hold(ms: float) -> str:
    """Hold the call open.

    Args:
        ms: Milliseconds.
    """
    IN_FLIGHT["now"] += 1
    IN_FLIGHT["max"] = max(IN_FLIGHT["max"], IN_FLIGHT["now"])
    await asyncio.sleep(ms / 1000)
    IN_FLIGHT["now"] -= 1
    return "held"


class Notebook:
    closed: list[str] = []

    def __init__(self, owner: str = "nobody"):
        self.owner = owner
        self.notes: list[str] = []

    async def aclose(self) -> None:
        Notebook.closed.append(self.owner)


@tool(session_factory=Notebook)
def note(text: str, *, session: Notebook) -> str:
    """Append a note and return all notes of this session.

    Args:
        text: The note.
    """
    session.notes.append(text)
    return f"{session.owner}: {' | '.join(session.notes)}"


def plain(a: int) -> int:
    """A plain function, wrapped automatically.

    Args:
        a: A number.
    """
    return a * 2


async def test_from_functions_routes_and_schemas():
    reg = ToolRegistry.from_functions([calculator, plain, hold])
    assert reg.names() == ["calculator", "plain", "hold"]
    assert [s["function"]["name"] for s in reg.schemas(["hold", "plain"])] == ["hold", "plain"]
    with pytest.raises(KeyError, match=r"^tools \['nope'\] are not served .*available: calculator, plain, hold"):
        reg.schemas(["nope"])  # an UnknownToolError: a KeyError and a UserError (one line from the CLI)
    with pytest.raises(UserError, match="tool 'nope' is not served"):
        reg.service_of("nope")
    assert (await reg.call("plain", {"a": 21})).content == "42"
    unknown = await reg.call("calc", {"expression": "1"})
    assert unknown.error_kind == "unknown_tool" and "calculator, plain, hold" in unknown.content
    await reg.aclose()


async def test_episode_sessions_isolate_state_and_release_it():
    Notebook.closed.clear()
    reg = ToolRegistry.from_functions([note], tools_kwargs={"note": {"owner": "default"}})
    async with reg.episode_session({"note": {"owner": "ann"}}) as a, reg.episode_session() as b:
        await reg.call("note", {"text": "x"}, session=a)
        assert (await reg.call("note", {"text": "y"}, session=a)).content == "ann: x | y"
        assert (await reg.call("note", {"text": "z"}, session=b)).content == "default: z"
        assert Notebook.closed == []
    assert sorted(Notebook.closed) == ["ann", "default"]
    with pytest.raises(ValueError, match="not open"):
        await reg.call("note", {"text": "late"}, session=a)


async def test_bad_session_kwargs_are_infra_not_policy():
    reg = ToolRegistry.from_functions([note])
    async with reg.episode_session({"note": {"colour": "red"}}) as s:
        result = await reg.call("note", {"text": "x"}, session=s)
    assert result.error_kind == "server_error" and result.infra_error and "colour" in result.content


async def test_concurrency_limit_in_process():
    IN_FLIGHT.update(now=0, max=0)
    reg = ToolRegistry.from_functions([hold], max_concurrency=4)
    results = await asyncio.gather(*(reg.call("hold", {"ms": 20}) for _ in range(20)))
    assert all(r.content == "held" for r in results)
    assert IN_FLIGHT["max"] == 4


async def test_local_timeout_and_output_cap():
    @tool
    async def slow() -> str:
        """Slow."""
        await asyncio.sleep(10)
        return "never"

    @tool
    def chatty() -> str:
        """Chatty."""
        return "x" * 10_000

    reg = ToolRegistry.from_functions([slow, chatty], timeout_s=0.1, max_output_chars=500)
    timed_out = await reg.call("slow", {})
    assert timed_out.error_kind == "timeout" and timed_out.infra_error
    capped = await reg.call("chatty", {})
    assert len(capped.content) == 500 and "truncated" in capped.content and capped.metrics["truncated_chars"]


async def test_from_config_builtin_and_functions(tmp_path):
    kb = tmp_path / "kb.jsonl"
    kb.write_text(json.dumps({"entity": "Paris", "facts": {"country": "France"}}) + "\n")
    reg = ToolRegistry.from_config({"builtin": ["calculator", "lookup"],
                                    "functions": ["test_tools_registry:plain"],
                                    "tools_kwargs": {"lookup": {"kb_path": str(kb)}}})
    await reg.start()
    assert reg.names() == ["calculator", "lookup", "plain"]
    async with reg.episode_session() as s:
        paris = await reg.call("lookup", {"entity": "paris"}, session=s)
        assert paris.content == '{"entity": "Paris", "country": "France"}'
    await reg.aclose()


def test_tools_yaml_loading_and_errors(tmp_path):
    base = tmp_path / "tools.yaml"
    base.write_text("services:\n  - url: http://127.0.0.1:9001\n    name: search\n    timeout_s: 5\n"
                    "builtin: [calculator]\n")
    cfg = load_config(ToolsConfig, data={"config": str(base), "builtin": ["lookup"], "max_concurrency": 32,
                                         "services": [{"url": "http://127.0.0.1:9002/mcp", "kind": "mcp"}]})
    from agentrl.tools.config import resolve_tools_config

    merged = resolve_tools_config(cfg)
    assert [s.name for s in merged.services] == ["search", "127.0.0.1:9002/mcp"]
    assert merged.builtin == ["calculator", "lookup"] and merged.max_concurrency == 32
    assert merged.services[0].call_budget_s == 3 * (5 + 5) + 2 * 5.0

    with pytest.raises(ConfigError, match="did you mean 'services'"):
        load_config(ToolsConfig, data={"servics": []})
    with pytest.raises(ConfigError, match="did you mean 'services.timeout_s'|timeout_s"):
        load_config(ToolsConfig, data={"services": [{"url": "http://h:1", "timeout": 3}]})
    with pytest.raises(ConfigError, match="unknown builtin"):
        load_config(ToolsConfig, data={"builtin": ["calculater"]})
    with pytest.raises(ConfigError, match="http://host:port"):
        load_config(ToolsConfig, data={"services": [{"url": "localhost:8000"}]})


def test_shipped_tool_configs_load():
    from pathlib import Path

    root = Path(__file__).resolve().parents[3] / "configs" / "tools"
    files = sorted(root.glob("*.yaml"))
    assert files, "configs/tools/*.yaml must exist"
    for path in files:
        load_config(ToolsConfig, path)


def test_in_process_registry_survives_several_event_loops():
    IN_FLIGHT.update(now=0, max=0)
    reg = ToolRegistry.from_functions([hold, calculator], max_concurrency=2)

    async def burst() -> list[str]:
        return [r.content for r in await asyncio.gather(*(reg.call("hold", {"ms": 5}) for _ in range(6)))]

    assert asyncio.run(burst()) == ["held"] * 6
    assert asyncio.run(burst()) == ["held"] * 6  # a second loop: limits are per loop, not bound to the first
    assert IN_FLIGHT["max"] == 2
