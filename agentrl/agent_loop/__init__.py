"""The multi-turn tool agent loop (token in / token out), group rollouts and rewards."""

from agentrl.agent_loop.config import AgentLoopConfig, RewardConfig, RolloutConfig
from agentrl.agent_loop.rewards import compute_reward
from agentrl.agent_loop.rollout import RolloutManager, rollout_metrics
from agentrl.agent_loop.tool_agent import ToolAgentLoop

__all__ = ["AgentLoopConfig", "RolloutConfig", "RewardConfig", "ToolAgentLoop", "RolloutManager", "compute_reward",
           "rollout_metrics"]
