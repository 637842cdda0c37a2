"""Services started with the Python API (`serve_in_thread`): service-side admission (503) and per-episode
knowledge bases for the lookup built-in (service default vs. the task's tools_kwargs)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from agentrl.tools import ToolRegistry, tool
from agentrl.tools.builtin.lookup import lookup
from agentrl.tools.service import serve_in_thread

pytestmark = pytest.mark.slow


@tool
async def nap(ms: float) -> str:
    """Sleep a little.

    Args:
        ms: Milliseconds.
    """
    await asyncio.sleep(ms / 1000)
    return "rested"


async def test_service_sheds_load_with_503_and_clients_retry():
    with serve_in_thread([nap], max_concurrency=2) as url:
        no_retry = ToolRegistry.from_config({"services": [{"url": url, "retries": 0}]})
        async with no_retry:
            results = await asyncio.gather(*(no_retry.call("nap", {"ms": 300}) for _ in range(6)))
        kinds = sorted(r.error_kind or "ok" for r in results)
        assert kinds.count("ok") == 2 and kinds.count("overloaded") == 4, kinds
        assert all(r.infra_error for r in results if r.is_error)

        patient = ToolRegistry.from_config({"services": [{"url": url, "retries": 8, "max_backoff_s": 0.5}]})
        async with patient:
            results = await asyncio.gather(*(patient.call("nap", {"ms": 100}) for _ in range(6)))
        assert all(r.content == "rested" for r in results), results


def write_kb(path, entity: str, country: str) -> str:
    path.write_text(json.dumps({"entity": entity, "facts": {"country": country}}) + "\n")
    return str(path)


async def test_lookup_kb_from_service_default_or_task_kwargs(tmp_path):
    default_kb = write_kb(tmp_path / "default.jsonl", "Lyon", "France")
    task_kb = write_kb(tmp_path / "task.jsonl", "Kyoto", "Japan")
    with serve_in_thread([lookup], defaults={"lookup": {"kb_path": default_kb}}) as url:
        assert httpx.get(f"{url}/health").json()["stateful_tools"] == ["lookup"]
        async with ToolRegistry.from_config({"services": [{"url": url}]}) as reg:
            async with reg.episode_session() as plain, reg.episode_session({"lookup": {"kb_path": task_kb}}) as own:
                lyon = await reg.call("lookup", {"entity": "lyon"}, session=plain)
                assert lyon.content == '{"entity": "Lyon", "country": "France"}'
                kyoto = await reg.call("lookup", {"entity": "kyoto"}, session=own)
                assert kyoto.content == '{"entity": "Kyoto", "country": "Japan"}'
                missing = await reg.call("lookup", {"entity": "lyon"}, session=own)
                assert missing.error_kind == "tool_error"
            async with reg.episode_session({"lookup": {"kb_path": str(tmp_path / "nope.jsonl")}}) as broken:
                bad = await reg.call("lookup", {"entity": "x"}, session=broken)
            assert bad.infra_error and "does not exist" in bad.content
