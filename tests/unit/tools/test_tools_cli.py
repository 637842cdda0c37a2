"""`agentrl tools list|serve` mistakes are one line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import pytest

from agentrl.cli import main
from agentrl.services import free_port


@pytest.fixture(autouse=True)
def _no_debug(monkeypatch):
    monkeypatch.delenv("AGENTRL_DEBUG", raising=False)


def error_line(capsys) -> str:
    """The one `error: ...` line the command printed on stderr (and nothing else)."""
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1 and err.startswith("error: "), err
    return err.removeprefix("error: ").rstrip("\n")


def test_tools_list_against_a_dead_service(tmp_path, capsys):
    port = free_port()
    config = tmp_path / "tools.yaml"
    config.write_text(f"services:\n  - url: http://127.0.0.1:{port}\n    name: calc\n")
    assert main(["tools", "list", "--config", str(config)]) == 2
    assert error_line(capsys) == (
        f"tool service 'calc' at http://127.0.0.1:{port} is unreachable (connection refused): start it with "
        f"`agentrl tools serve module:fn --port {port}` or fix services[0].url in {config}")


def test_tools_serve_of_a_function_without_type_hints(tmp_path, capsys):
    src = tmp_path / "my_tools.py"
    src.write_text("def add(a, b: int) -> int:\n    return a + b\n")
    assert main(["tools", "serve", f"{src}:add", "--port", str(free_port())]) == 2
    assert error_line(capsys) == (f"tool 'add' ({src}:1): parameter 'a' needs a type hint, e.g. `a: str` (the "
                                  f"hints become the JSON schema the model sees)")
    decorated = tmp_path / "decorated.py"
    decorated.write_text("from agentrl.tools import tool\n\n\n@tool\ndef scale(x: float, factor=2.0) -> float:\n"
                         "    return x * factor\n")
    assert main(["tools", "serve", f"{decorated}:scale", "--port", str(free_port())]) == 2
    assert "tool 'scale' (" in (line := error_line(capsys)) and "parameter 'factor' needs a type hint, e.g. " \
        "`factor: float`" in line


def test_tools_serve_spec_mistakes(tmp_path, capsys):
    assert main(["tools", "serve", "agentrl.tools.builtin.calculator"]) == 2
    assert "must look like package.module:fn1,fn2" in error_line(capsys)
    assert main(["tools", "serve", "agentrl.tools.builtin.calculator:calculator", "--tool-kwargs", "{x"]) == 2
    assert error_line(capsys).startswith("--tool-kwargs is not valid JSON")
