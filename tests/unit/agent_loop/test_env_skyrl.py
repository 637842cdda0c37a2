"""The skyrl_gym adapter against the installed skyrl-gym package: its multi-turn GSM8k environment runs through
EnvAgentLoop with its own per-turn rewards; without the skyrl-gym or openenv-core package, one line says how to
install it (the openenv adapter's server test is tests/integration/agent_loop/test_env_openenv.py)."""

from __future__ import annotations

import sys

import pytest
from scripted_engine import ScriptedEngine

from agentrl.agent_loop import AgentLoopConfig
from agentrl.config import ConfigError
from agentrl.envs.base import env_class
from agentrl.envs.loop import EnvAgentLoop
from agentrl.types import Task

pytest.importorskip("skyrl_gym")  # the envs extra; `make setup` installs it

QUESTION = [{"role": "user", "content": "Natalia sold 48 clips in April and half as many in May. How many in all?"}]


def skyrl_task(env_id: str, extras: dict) -> Task:
    return Task(prompt=QUESTION, reward={"type": "env"}, task_id="gsm8k-1",
                env={"name": "skyrl_gym", "kwargs": {"env_id": env_id, "extras": extras}})


async def test_gsm8k_multi_turn_rewards_every_turn(tokenizer):
    engine = ScriptedEngine(tokenizer, ["48 + 24 #### 70", "#### 72"])
    task = skyrl_task("gsm8k_multi_turn", {"reward_spec": {"ground_truth": "72"}, "max_turns": 3})
    episode = await EnvAgentLoop(engine, tokenizer, AgentLoopConfig()).run(task)
    assert (episode.finish_reason, episode.metrics["stop_detail"]) == ("stop", "env_done")
    # skyrl's per-turn score: format_score 0.2 / max_turns for a well-formatted wrong answer, 1.0 for the right one
    assert episode.turn_rewards == pytest.approx([0.2 / 3, 1.0])
    assert episode.messages[0] == QUESTION[0] and episode.messages[2]["role"] == "user"
    assert "#### ANSWER" in episode.messages[2]["content"]  # the environment's own follow-up, with mask 0
    observation = [t for t, m in zip(episode.response_ids, episode.response_mask) if not m]
    assert "#### ANSWER" in tokenizer.decode(observation)
    episode.check()


async def test_a_skyrl_env_that_raises_is_an_infra_fault(tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, [])
    task = skyrl_task("gsm8k_multi_turn", {"reward_spec": {}})  # skyrl asserts ground_truth in its constructor
    episode = await EnvAgentLoop(engine, tiny_tokenizer, AgentLoopConfig()).run(task)
    assert episode.infra_error and "constructor raised AssertionError" in episode.metrics["infra_detail"]
    assert engine.calls == []


@pytest.mark.parametrize("name, package, adapter", [("skyrl_gym", "skyrl_gym", "agentrl.envs.skyrl"),
                                                    ("openenv", "openenv", "agentrl.envs.openenv_client")])
def test_without_the_package_one_line_names_the_extra(monkeypatch, name, package, adapter):
    monkeypatch.setitem(sys.modules, package, None)
    for module in [m for m in sys.modules if m.startswith(f"{package}.")]:
        monkeypatch.delitem(sys.modules, module)
    monkeypatch.delitem(sys.modules, adapter, raising=False)
    with pytest.raises(ConfigError) as info:
        env_class(name, {})
    message = str(info.value)
    assert "\n" not in message and "pip install -e '.[envs]'" in message and f"the {name} environment" in message
