"""`agentrl tools|engine|sandbox serve` print "... ready on URL" only once that URL answers."""

from __future__ import annotations

import re
import selectors
import subprocess
import time

import httpx
import pytest
from helpers import REPO_ROOT

from agentrl.services import agentrl_command, stop_process_group

pytestmark = pytest.mark.slow

READY = re.compile(r"^(tool service|engine|sandbox) ready on (http://127\.0\.0\.1:\d+)")


def wait_for_ready_line(proc: subprocess.Popen, limit_s: float = 180.0) -> tuple[str, str]:
    """(the ready line, its URL) from the service's stderr; fails with its output if it exits or stays silent."""
    lines: list[str] = []
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stderr, selectors.EVENT_READ)
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            if not sel.select(timeout=1.0):
                continue
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(line)
            match = READY.match(line)
            if match:
                return line.strip(), match.group(2)
    pytest.fail(f"no ready line (exit code {proc.poll()}):\n{''.join(lines)[-3000:]}")


@pytest.mark.parametrize("kind", ["tools", "engine", "sandbox"])
def test_ready_line_comes_once_the_port_answers(kind, tiny_model_dir):
    args = {"tools": ["tools", "serve", "agentrl.tools.builtin.calculator:calculator"],
            "engine": ["engine", "serve", "--model", str(tiny_model_dir), "--num-threads", "1"],
            "sandbox": ["sandbox", "serve", "--allow-unsafe"]}[kind]
    proc = subprocess.Popen(agentrl_command(*args, "--port", "0"), cwd=REPO_ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        line, url = wait_for_ready_line(proc)
        # no retry, no wait: the line promises that the app has started and its socket accepts connections
        health = httpx.get(f"{url}/health", timeout=30.0, trust_env=False)
        assert health.status_code == 200, (line, health.text)
        if kind == "tools":
            assert line.endswith("(1 tool: calculator)")
            call = httpx.post(f"{url}/tools/calculator", json={"arguments": {"expression": "6*7"}}, timeout=30.0)
            assert call.json() == {"content": '{"value": "42"}', "is_error": False}
        elif kind == "engine":
            assert "max_model_len=" in line
        else:
            assert line.endswith(f"isolation {health.json()['isolation']})")  # bwrap, or none where it is missing
    finally:
        stop_process_group(proc)
        proc.stderr.close()
