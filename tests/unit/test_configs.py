"""Every shipped config loads with its dataclass: top-level configs/*.yaml are TrainConfigs, configs/tools/*.yaml
are ToolsConfigs. A config that drifts from the code fails here, not at the start of a GPU job."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.config import load_config
from agentrl.tools.config import ToolsConfig
from agentrl.trainer.config import TrainConfig

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_train_config_loads(path, monkeypatch):
    monkeypatch.chdir(CONFIGS.parent)  # tools.config paths are relative to the repository root
    cfg = load_config(TrainConfig, path)
    assert cfg.model.path and cfg.data.train_files
    assert cfg.data.train_batch_size % cfg.actor.ppo_mini_batch_size == 0


@pytest.mark.parametrize("path", sorted((CONFIGS / "tools").glob("*.yaml")), ids=lambda p: p.name)
def test_tools_config_loads(path):
    load_config(ToolsConfig, path)


def test_there_are_cpu_and_gpu_training_configs():
    backends = {load_config(TrainConfig, p).engine.backend for p in CONFIGS.glob("*.yaml")}
    assert backends == {"local", "sglang"}
