"""The verifiers adapter's config check: without the package, naming it as the agent program fails at config
load with one line saying how to install it."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from agentrl.agent_loop.config import load_agent_program
from agentrl.config import ConfigError

SPEC = "agentrl.envs.verifiers_env:verifiers_agent"


def test_missing_verifiers_is_one_line_naming_the_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "verifiers" else real(name, *a))
    monkeypatch.delitem(sys.modules, "agentrl.envs.verifiers_env", raising=False)
    with pytest.raises(ConfigError) as e:
        load_agent_program(SPEC)
    assert "pip install -e '.[agents]'" in str(e.value) and "\n" not in str(e.value)


def test_the_adapter_is_a_valid_agent_program():
    pytest.importorskip("verifiers.v1", reason="pip install -e '.[agents]'")
    assert load_agent_program(SPEC).__name__ == "verifiers_agent"
