"""What a user sets to serve a LoRA policy from SGLang servers: `engine.lora_sync`, `agentrl engine launch-sglang
--lora-rank` (SGLang's LoRA launch flags) and `agentrl engine serve --enable-lora`, and the one-line errors."""

from __future__ import annotations

import pytest

from agentrl.config import ConfigError, load_config
from agentrl.inference import EngineConfig
from agentrl.inference.launcher import LaunchArgsError, SGLangLaunchSpec, lora_launch_args, sglang_server_commands

SGLANG = {"backend": "sglang", "urls": ["http://127.0.0.1:30000"]}


def test_engine_lora_sync_key():
    assert EngineConfig().lora_sync == "merged"
    assert load_config(EngineConfig, data={**SGLANG, "lora_sync": "adapter"}).lora_sync == "adapter"
    with pytest.raises(ConfigError, match="engine.lora_sync='adapter' loads adapters on SGLang servers"):
        load_config(EngineConfig, data={"lora_sync": "adapter"})
    with pytest.raises(ConfigError, match="lora_sync"):
        load_config(EngineConfig, data={**SGLANG, "lora_sync": "delta"})


def test_launch_sglang_with_lora_rank_passes_sglangs_lora_flags():
    spec = SGLangLaunchSpec(model_path="/models/qwen", num_servers=2, lora_rank=16,
                            lora_target_modules=["q_proj", "v_proj"])
    for _env, cmd in sglang_server_commands(spec):
        tail = cmd[cmd.index("--enable-lora"):]
        assert tail == ["--enable-lora", "--max-lora-rank", "16", "--lora-target-modules", "q_proj", "v_proj",
                        "--max-loras-per-batch", "2", "--max-loaded-loras", "2"]
    assert all("--enable-lora" not in cmd for _, cmd in sglang_server_commands(SGLangLaunchSpec(model_path="m")))
    assert lora_launch_args(8, "all-linear", max_loras_per_batch=4)[-6:] == [
        "--lora-target-modules", "all", "--max-loras-per-batch", "4", "--max-loaded-loras", "4"]


@pytest.mark.parametrize("spec, message", [
    ({"lora_rank": 8}, "--lora-target-modules) is empty"),
    ({"lora_rank": 0, "lora_target_modules": ["q_proj"]}, "must be >= 1"),
    ({"lora_rank": 8, "lora_target_modules": ["q_proj"], "extra_args": ["--max-lora-rank=64"]},
     "--max-lora-rank=64 after -- clashes with --lora-rank"),
])
def test_launch_lora_mistakes_are_one_line(spec, message):
    with pytest.raises(LaunchArgsError, match=message.replace("(", r"\(").replace(")", r"\)")):
        SGLangLaunchSpec(model_path="m", **spec)
    with pytest.raises(LaunchArgsError, match="not a pattern"):
        lora_launch_args(8, r".*proj")


def test_serve_lora_limits_need_enable_lora(capsys):
    from agentrl.cli import main

    assert main(["engine", "serve", "--model", "m", "--port", "0", "--lora-target-modules", "q_proj"]) == 2
    assert "error: --lora-target-modules set LoRA limits but LoRA is off: add --enable-lora" in capsys.readouterr().err
