from __future__ import annotations

import pytest

from agentrl.agent_loop.config import AgentLoopConfig, RewardConfig, RolloutConfig
from agentrl.config import ConfigError, load_config


def test_defaults_load_and_unknown_key_suggests():
    assert load_config(AgentLoopConfig).tool_parser == "hermes"
    with pytest.raises(ConfigError, match="max_assistant_turns"):
        load_config(AgentLoopConfig, overrides=["max_assistant_turn=3"])


@pytest.mark.parametrize("cls,override,message", [
    (AgentLoopConfig, "max_response_tokens=0", "max_response_tokens must be >= 1"),
    (AgentLoopConfig, "tool_parser=json", "unknown"),
    (AgentLoopConfig, "episode_timeout_s=0", "episode_timeout_s"),
    (RolloutConfig, "n=0", "rollout.n"),
    (RolloutConfig, "top_k=0", "top_k"),
    (RewardConfig, "sandbox_url=localhost:8080", "http://"),
])
def test_invalid_values_fail_at_load(cls, override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(cls, overrides=[override])


def test_custom_reward_is_imported_and_checked_at_load():
    cfg = load_config(RewardConfig, data={"custom": {"len": "tests_reward_fns:length_reward"}})
    assert cfg.custom == {"len": "tests_reward_fns:length_reward"}
    with pytest.raises(ConfigError, match="cannot import module"):
        load_config(RewardConfig, data={"custom": {"x": "no_such_module_xyz:f"}})
    with pytest.raises(ConfigError, match=r"must accept \(task, episode, config\)"):
        load_config(RewardConfig, data={"custom": {"x": "tests_reward_fns:wrong_arity"}})
