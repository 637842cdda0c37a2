"""A dead or foreign tool service is one line and exit code 2 from `agentrl tools list` and `agentrl eval`."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers import REPO_ROOT, free_port, service

from agentrl.services import agentrl_command

pytestmark = pytest.mark.slow


def run_agentrl(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "AGENTRL_DEBUG"}
    return subprocess.run(agentrl_command(*args), cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def one_error_line(out: subprocess.CompletedProcess) -> str:
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith("error: ")
    return out.stderr.removeprefix("error: ").rstrip("\n")


def test_eval_against_a_dead_tool_service(tmp_path, tiny_model_dir):
    port = free_port()
    config = tmp_path / "tools.yaml"
    config.write_text(f"services:\n  - url: http://127.0.0.1:{port}\n    name: calc\n")
    out = run_agentrl("eval", "--model", str(tiny_model_dir), "--suite", "calc", "--num-tasks", "2",
                      "--tools-config", str(config), "--out", str(tmp_path / "eval"))
    assert one_error_line(out) == (
        f"tool service 'calc' at http://127.0.0.1:{port} is unreachable (connection refused): start it with "
        f"`agentrl tools serve module:fn --port {port}` or fix services[0].url in {config}")


def test_tools_list_against_a_service_that_is_not_a_tool_service(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = tmp_path / "tools.yaml"
    config.write_text(f"services:\n  - url: {url}\n    name: web\n")
    with service([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory",
                  str(tmp_path)], f"{url}/"):
        out = run_agentrl("tools", "list", "--config", str(config))
    line = one_error_line(out)
    assert line.startswith(f"tool service 'web' at {url} answered GET /tools with HTTP 404 (")
    assert line.endswith(f"is {url} an agentrl tool service (`agentrl tools serve`)? fix services[0].url in "
                         f"{config} or the service")
