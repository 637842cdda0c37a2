"""The few defaults the docs state in prose agree with the code (every other default is left to
`--print-config` and the config classes, so it cannot drift)."""

from __future__ import annotations

import re

import pytest
from helpers import REPO_ROOT

from agentrl.agent_loop.config import AgentLoopConfig
from agentrl.trainer.config import CriticConfig, KLControlConfig, RolloutCorrectionConfig
from sandbox.config import DEFAULT_HOST_UID_BASE, SandboxConfig


def _stated(page: str) -> str:
    """The page's text with line breaks and runs of spaces collapsed, as a reader sees it."""
    return re.sub(r"\s+", " ", (REPO_ROOT / "docs" / page).read_text())


def _warm_pool_formula() -> str:
    """`2 x max_concurrency + 4`, read off what SandboxConfig derives for two concurrencies."""
    one, two = SandboxConfig(max_concurrency=1).warm_pool, SandboxConfig(max_concurrency=2).warm_pool
    return f"{two - one} x `max_concurrency` + {one - (two - one)}"


STATED = [
    ("algorithms.md", lambda: f"`kl_ctrl.kl_coef` (default {KLControlConfig().kl_coef:g})"),
    ("algorithms.md", lambda: f"`critic.cliprange_value` (default {CriticConfig().cliprange_value:g})"),
    ("algorithms.md", lambda: f"TIS bound (default {RolloutCorrectionConfig().threshold:g})"),
    ("evaluation.md", lambda: f"the `agent:` defaults ({AgentLoopConfig().max_new_tokens_per_turn} tokens per turn, "
                              f"{AgentLoopConfig().max_assistant_turns} turns)"),
    ("sandbox.md", lambda: f"default {_warm_pool_formula()}"),
    ("sandbox.md", lambda: f"default from {DEFAULT_HOST_UID_BASE:,}"),
]


@pytest.mark.parametrize(("page", "render"), STATED, ids=[f"{p}:{i}" for i, (p, _) in enumerate(STATED)])
def test_a_default_the_docs_state_is_the_codes(page, render):
    expected = render()
    assert expected in _stated(page), f"docs/{page} should say {expected!r} (the code's default)"
