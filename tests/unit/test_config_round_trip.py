"""Every config kind loads back as the same config from what agentrl writes: `save_config` (a run's config.yaml)
and `--print-config` (agentrl train, agentrl sft)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.agent_loop.config import AgentLoopConfig, RewardConfig, RolloutConfig
from agentrl.cli import main
from agentrl.config import load_config, save_config
from agentrl.inference.config import EngineConfig
from agentrl.tools.config import ToolsConfig
from agentrl.trainer.config import TrainConfig
from agentrl.trainer.sft import SFTConfig
from sandbox.config import SandboxConfig

ROOT = Path(__file__).resolve().parents[2]

KINDS = [
    (TrainConfig, ["algorithm.adv_estimator=gae", "algorithm.lam=0.95", "actor.policy_loss.loss_mode=kl_cov",
                   "actor.policy_loss.ppo_kl_coef=0.2", "critic.lr=2e-5", "tools.builtin=[calculator]",
                   "tools.services=[{url: 'http://127.0.0.1:9/', kind: mcp}]", "reward.custom={}"]),
    (SFTConfig, ["actor.lr=1e-4", "sft.max_steps=5", "data.train_files=[d.jsonl]"]),
    (EngineConfig, ["backend=sglang", "urls=[http://127.0.0.1:30000]", "max_model_len=512"]),
    (ToolsConfig, ["services=[{url: 'http://h:1', tools: [a]}]", "max_output_chars=100"]),
    (AgentLoopConfig, ["max_assistant_turns=3", "episode_timeout_s=null"]),
    (RolloutConfig, ["n=2", "top_k=5", "seed=3"]),
    (RewardConfig, ["answer_from=final_text", "overlong_buffer.enable=true"]),
    (SandboxConfig, ["max_concurrency=3", "backend=docker"]),
]


@pytest.mark.parametrize("cls,overrides", KINDS, ids=lambda k: getattr(k, "__name__", ""))
def test_the_saved_config_loads_back_as_the_same_config(tmp_path, cls, overrides):
    cfg = load_config(cls, overrides=overrides)
    assert load_config(cls, save_config(cfg, tmp_path)) == cfg
    assert load_config(cls, save_config(cls(), tmp_path, "defaults.yaml")) == cls()


@pytest.mark.parametrize("command,cls,config", [
    ("train", TrainConfig, "configs/calc_tiny_cpu.yaml"), ("sft", SFTConfig, "configs/sft/tiny_cpu.yaml")])
def test_print_config_loads_back_as_the_same_config(tmp_path, capsys, monkeypatch, command, cls, config):
    monkeypatch.chdir(ROOT)
    overrides = ["actor.lr=2e-5"]
    assert main([command, config, *overrides, "--print-config"]) == 0
    printed = tmp_path / "printed.yaml"
    printed.write_text(capsys.readouterr().out)
    assert load_config(cls, printed) == load_config(cls, config, overrides)
