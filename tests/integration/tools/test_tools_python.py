"""The `python` built-in against a real sandbox service: one interpreter per episode, released on exit."""

from __future__ import annotations

import os
import shutil
import sys

import httpx
import pytest
from helpers import free_port, service

from agentrl.tools import ToolRegistry
from agentrl.tools.builtin.python import python

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sandbox_url():
    if not sys.platform.startswith("linux") or shutil.which("bwrap") is None or os.geteuid() != 0:
        pytest.skip("the sandbox's bwrap backend needs Linux, bubblewrap and root")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = ["python", "-m", "sandbox", "serve", "--port", str(port), "--set", "max_sessions=4",
            "--set", "default_memory_mb=256"]
    with service(args, f"{url}/v1/ping"):
        yield url


def live_sessions(url: str) -> int:
    return httpx.get(f"{url}/health", timeout=30).json()["live_sessions"]


async def test_python_state_persists_per_episode_and_is_released(sandbox_url):
    reg = ToolRegistry.from_functions([python], tools_kwargs={"python": {"sandbox_url": sandbox_url,
                                                                         "cell_timeout_s": 5}})
    try:
        async with reg.episode_session() as a, reg.episode_session() as b:
            assert (await reg.call("python", {"code": "x = 40"}, session=a)).content == "(no output)"
            assert (await reg.call("python", {"code": "print(x + 2)"}, session=a)).content == "42"
            other = await reg.call("python", {"code": "print(x)"}, session=b)
            assert not other.is_error and "NameError" in other.content  # the model's bug: an observation
            assert live_sessions(sandbox_url) == 2
        assert live_sessions(sandbox_url) == 0
    finally:
        await reg.aclose()


async def test_sandbox_down_is_an_infra_error():
    dead = f"http://127.0.0.1:{free_port()}"
    reg = ToolRegistry.from_functions([python], tools_kwargs={"python": {"sandbox_url": dead}})
    async with reg.episode_session() as s:
        result = await reg.call("python", {"code": "print(1)"}, session=s)
    assert result.infra_error and result.error_kind == "unreachable", result


async def test_a_tasks_setup_runs_once_and_each_episode_forks_it(sandbox_url):
    setup = "import time, colorsys\nstamp = time.time_ns()\nopen('prepared.txt', 'w').write('ready')"
    reg = ToolRegistry.from_functions([python], tools_kwargs={"python": {"sandbox_url": sandbox_url,
                                                                         "cell_timeout_s": 5}})
    task_kwargs = {"python": {"setup": setup}}
    probe = {"code": "print(stamp, 'colorsys' in dir(), open('prepared.txt').read())\nstamp = 0"}
    try:
        async with reg.episode_session(task_kwargs) as a, reg.episode_session(task_kwargs) as b:
            first = (await reg.call("python", probe, session=a)).content
            assert live_sessions(sandbox_url) == 2  # the fork source and a's fork
            second = (await reg.call("python", probe, session=b)).content
            assert first == second and first.endswith(" True ready"), (first, second)  # one setup, two forks
            assert live_sessions(sandbox_url) == 3
        assert live_sessions(sandbox_url) == 0  # the source goes with the last episode that held a fork of it
        async with reg.episode_session({"python": {"setup": "raise ValueError('bad setup')"}}) as c:
            result = await reg.call("python", {"code": "print(1)"}, session=c)
        assert result.infra_error and "setup failed" in result.content and "bad setup" in result.content, result
        assert live_sessions(sandbox_url) == 0
    finally:
        await reg.aclose()


@pytest.mark.parametrize("setup", [None, "import colorsys\nbase = 40"])
async def test_an_episode_survives_a_sandbox_restart(sandbox_url, setup):
    """The sandbox service dies and comes back on the same port: the episode's interpreter is rebuilt from the
    replay log (a fork of the setup first, when the task has one), the work dir from its snapshot, and the episode
    goes on."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = ["python", "-m", "sandbox", "serve", "--port", str(port), "--set", "max_sessions=4"]
    kwargs = {"python": {"sandbox_url": url, "cell_timeout_s": 5, **({"setup": setup} if setup else {})}}
    reg = ToolRegistry.from_functions([python], tools_kwargs=kwargs)
    try:
        async with reg.episode_session() as episode:
            with service(args, f"{url}/v1/ping"):
                first = "x = 2 + (base if 'base' in dir() else 40)\nopen('kept.txt', 'w').write('kept')"
                assert not (await reg.call("python", {"code": first}, session=episode)).is_error
                assert (await reg.call("python", {"code": "x += 0\nundefined"}, session=episode)).is_error is False
            with service(args, f"{url}/v1/ping"):  # a new service: it knows no session
                result = await reg.call("python", {"code": "print(x, open('kept.txt').read())"}, session=episode)
                assert not result.infra_error and result.content == "42 kept", result
                assert result.metrics["sandbox_restored"] == 1 and result.metrics["replayed_cells"] == 2, result
                assert result.metrics["restored_files"] == 1 and result.metrics["restore_diverged"] == 0, result
                again = await reg.call("python", {"code": "print(x)"}, session=episode)
                assert again.content == "42" and "sandbox_restored" not in again.metrics
    finally:
        await reg.aclose()


async def test_a_state_built_by_a_timed_out_cell_is_not_rebuilt():
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = ["python", "-m", "sandbox", "serve", "--port", str(port), "--set", "max_sessions=2"]
    reg = ToolRegistry.from_functions([python], tools_kwargs={"python": {"sandbox_url": url, "cell_timeout_s": 1}})
    try:
        async with reg.episode_session() as episode:
            with service(args, f"{url}/v1/ping"):
                slow = "import time\nx = 1\ntime.sleep(30)"  # interrupted: how far it got is not replayable
                assert "KeyboardInterrupt" in (await reg.call("python", {"code": slow}, session=episode)).content
            with service(args, f"{url}/v1/ping"):
                result = await reg.call("python", {"code": "print(x)"}, session=episode)
                assert result.infra_error and "cannot be rebuilt" in result.content, result
    finally:
        await reg.aclose()
