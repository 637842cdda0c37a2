"""Tool services on loopback: discovery, calls, error kinds, timeouts, limits, sessions, retries, kill/restart."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import httpx
import pytest
from helpers import free_port, service

from agentrl.tools import ToolRegistry, ToolServiceError

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
TOOLBOX = "tests/integration/tools/toolbox.py:describe,sleep_for,boom,refuse,probe,stats,count"


def serve_args(port: int, spec: str = TOOLBOX) -> list[str]:
    return ["python", "-m", "agentrl.cli", "tools", "serve", spec, "--port", str(port)]


@pytest.fixture(scope="module")
def toolbox_url():
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with service(serve_args(port), f"{url}/health"):
        yield url


@pytest.fixture(scope="module")
def flaky_url():
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with service(["python", str(HERE / "flaky_app.py"), str(port)], f"{url}/retry/health"):
        yield url


def registry_for(url: str, **service_kwargs) -> ToolRegistry:
    limits = {k: service_kwargs.pop(k) for k in ("max_concurrency_global",) if k in service_kwargs}
    return ToolRegistry.from_config({"max_concurrency": limits.get("max_concurrency_global", 256),
                                     "services": [{"url": url, "name": "toolbox", **service_kwargs}]})


async def test_discovery_calls_and_error_kinds(toolbox_url):
    async with registry_for(toolbox_url, timeout_s=5) as reg:
        assert reg.names() == ["describe", "sleep_for", "boom", "refuse", "probe", "stats", "count"]
        params = reg.schemas(["describe"])[0]["function"]["parameters"]
        assert params["required"] == ["name", "count"]
        assert params["properties"]["mode"]["enum"] == ["short", "long"]
        assert params["properties"]["name"]["description"] == "The thing's name."

        ok = await reg.call("describe", {"name": "apple", "count": 3, "tags": ["red"], "loud": True})
        assert (ok.is_error, ok.content) == (False, "3 X APPLE RATIO=0.5 TAGS=RED MODE=SHORT")
        assert ok.metrics["service"] == "toolbox"

        bad = await reg.call("describe", {"name": "apple", "count": "many", "colour": 1})
        assert bad.error_kind == "bad_arguments" and not bad.infra_error
        assert "'count'" in bad.content and "unexpected argument 'colour'" in bad.content

        unknown = await reg.call("nope", {})
        assert unknown.error_kind == "unknown_tool" and "describe" in unknown.content

        raised = await reg.call("boom", {"message": "disk full"})
        assert raised.error_kind == "tool_raised" and "RuntimeError: disk full" in raised.content
        refused = await reg.call("refuse", {"message": "no such row"})
        assert refused.error_kind == "tool_error" and refused.content == "Error: no such row"
        assert not raised.infra_error and not refused.infra_error


def test_unknown_tool_is_404_listing_known_names(toolbox_url):
    r = httpx.post(f"{toolbox_url}/tools/nope", json={"arguments": {}})
    assert r.status_code == 404
    assert "describe" in r.json()["tools"] and r.json()["error_kind"] == "unknown_tool"


async def test_slow_tool_hits_timeout_without_hanging(toolbox_url):
    async with registry_for(toolbox_url, timeout_s=0.5, retries=2) as reg:
        start = time.monotonic()
        result = await reg.call("sleep_for", {"seconds": 5})
        elapsed = time.monotonic() - start
    assert result.error_kind == "timeout" and result.infra_error
    assert elapsed < 4.0, f"a 0.5 s timeout call took {elapsed:.1f}s: read timeouts must not be retried"


async def test_concurrency_limits_measured_in_flight(toolbox_url):
    async with registry_for(toolbox_url, max_concurrency=3) as reg:
        await reg.call("stats", {"reset": True})
        results = await asyncio.gather(*(reg.call("probe", {"ms": 100}) for _ in range(12)))
        assert all(not r.is_error for r in results)
        seen = eval_stats((await reg.call("stats", {"reset": True})).content)
        assert 2 <= seen["max_in_flight"] <= 3, seen
    async with registry_for(toolbox_url, max_concurrency=50, max_concurrency_global=2) as reg:
        await asyncio.gather(*(reg.call("probe", {"ms": 100}) for _ in range(8)))
        seen = eval_stats((await reg.call("stats", {"reset": True})).content)
        assert seen["max_in_flight"] <= 2, seen


def eval_stats(content: str) -> dict:
    import json

    return json.loads(content)


async def test_session_state_kept_per_episode_and_released(toolbox_url):
    async with registry_for(toolbox_url) as reg:
        await reg.call("stats", {"reset": True})
        async with reg.episode_session({"count": {"start": 100}}) as a, reg.episode_session() as b:
            assert (await reg.call("count", {"step": 1}, session=a)).content == "101"
            assert (await reg.call("count", {"step": 5}, session=b)).content == "5"
            assert (await reg.call("count", {"step": 1}, session=a)).content == "102"
            assert httpx.get(f"{toolbox_url}/health").json()["sessions"] == 2
        assert httpx.get(f"{toolbox_url}/health").json()["sessions"] == 0
        seen = eval_stats((await reg.call("stats", {}, )).content)
        assert seen["opened"] == 2 and seen["released"] == 2
        # Without an episode session a stateful tool gets a one-call session.
        assert (await reg.call("count", {"step": 3})).content == "3"


async def test_503_retry_after_is_honoured(flaky_url):
    async with registry_for(f"{flaky_url}/retry", retries=2, max_backoff_s=5) as reg:
        result = await reg.call("ping", {"key": "a"})
    assert (result.is_error, result.content) == (False, "pong")
    arrivals = httpx.get(f"{flaky_url}/log").json()["retry/a"]
    assert len(arrivals) == 2 and arrivals[1] - arrivals[0] >= 0.9, arrivals


async def test_overloaded_and_5xx_are_infra_errors(flaky_url):
    async with registry_for(f"{flaky_url}/busy", retries=2, backoff_s=0.01) as reg:
        busy = await reg.call("ping", {"key": "b"})
    assert busy.error_kind == "overloaded" and busy.infra_error and busy.metrics["attempts"] == 3
    async with registry_for(f"{flaky_url}/crash", retries=2) as reg:
        crash = await reg.call("ping", {"key": "c"})
    assert crash.error_kind == "server_error" and crash.infra_error and "on fire" in crash.content
    assert len(httpx.get(f"{flaky_url}/log").json()["crash/c"]) == 1, "a 500 must not be retried"


async def test_discovery_errors_name_the_service(flaky_url):
    with pytest.raises(ToolServiceError, match="tool service 'toolbox' at .*(schema #0|parameters)"):
        await registry_for(f"{flaky_url}/bad").start()
    port = free_port()
    dead = f"http://127.0.0.1:{port}"
    with pytest.raises(ToolServiceError) as err:
        await registry_for(dead).start()
    assert str(err.value) == (f"tool service 'toolbox' at {dead} is unreachable (connection refused): "
                              f"start it with `agentrl tools serve module:fn --port {port}` or fix services[0].url")


async def test_service_killed_mid_run_then_restarted():
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    reg = registry_for(url, timeout_s=10, retries=2, backoff_s=0.05)
    try:
        with service(serve_args(port), f"{url}/health") as proc:
            assert (await reg.call("describe", {"name": "x", "count": 1})).content.startswith("1 x x")
            in_flight = [asyncio.create_task(reg.call("sleep_for", {"seconds": 30})) for _ in range(3)]
            await asyncio.sleep(0.5)
            os.killpg(proc.pid, signal.SIGKILL)
            start = time.monotonic()
            lost = await asyncio.wait_for(asyncio.gather(*in_flight), timeout=8)
            after = await reg.call("describe", {"name": "x", "count": 1})
            elapsed = time.monotonic() - start
        assert all(r.error_kind == "unreachable" and r.infra_error for r in lost), lost
        assert after.error_kind == "unreachable" and after.infra_error
        assert elapsed < 5.0, f"calls to a dead service took {elapsed:.1f}s; they must fail fast"
        with service(serve_args(port), f"{url}/health"):
            recovered = await reg.call("describe", {"name": "y", "count": 2})
        assert not recovered.is_error and recovered.content.startswith("2 x y")
    finally:
        await reg.aclose()


def test_cli_tools_list_discovers_a_config(toolbox_url, tmp_path, capsys):
    from agentrl.cli import main

    config = tmp_path / "tools.yaml"
    config.write_text(f"services:\n  - url: {toolbox_url}\n    name: toolbox\n    tools: [describe, count]\n"
                      f"builtin: [calculator]\n")
    assert main(["tools", "list", "--config", str(config), "--json"]) == 0
    rows = [__import__("json").loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["tool"], r["service"]) for r in rows] == [("calculator", "local"), ("describe", "toolbox"),
                                                        ("count", "toolbox")]
    assert rows[1]["description"] == "Describe a thing."


async def test_saturated_service_does_not_starve_others(toolbox_url):
    config = {"max_concurrency": 4, "services": [
        {"url": toolbox_url, "name": "slow-lane", "tools": ["probe"], "max_concurrency": 1},
        {"url": toolbox_url, "name": "fast-lane", "tools": ["describe"], "max_concurrency": 4}]}
    done: list[str] = []

    async def tracked(name: str, args: dict) -> None:
        result = await reg.call(name, args)
        assert not result.is_error, result
        done.append(name)

    async with ToolRegistry.from_config(config) as reg:
        slow = [asyncio.create_task(tracked("probe", {"ms": 150})) for _ in range(8)]
        await asyncio.sleep(0.05)
        await tracked("describe", {"name": "x", "count": 1})
        await asyncio.gather(*slow)
    # Queued slow-lane calls must not sit on global slots: the fast lane answers while the slow one is busy.
    assert done.index("describe") <= 3, done
