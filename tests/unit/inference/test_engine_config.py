"""EngineConfig validation and the make_engine factory."""

from __future__ import annotations

import pytest

from agentrl.config import ConfigError, load_config
from agentrl.inference import Engine, EngineConfig, make_engine
from agentrl.inference.local import LocalEngine
from agentrl.inference.sglang import SGLangEngine


def test_config_errors_name_the_key_and_fix():
    with pytest.raises(ConfigError, match="max_batch_size"):
        load_config(EngineConfig, data={"max_bach_size": 4})
    with pytest.raises(ConfigError, match="engine.urls is empty"):
        load_config(EngineConfig, data={"backend": "sglang"})
    with pytest.raises(ConfigError, match="http://"):
        load_config(EngineConfig, data={"backend": "sglang", "urls": ["127.0.0.1:30000"]})
    with pytest.raises(ConfigError, match="max_batch_size must be >= 1"):
        load_config(EngineConfig, data={"max_batch_size": 0})
    with pytest.raises(ConfigError, match="every server in engine.urls is a replica"):
        load_config(EngineConfig, data={"backend": "sglang", "urls": ["http://127.0.0.1:30000"], "replicas": 2})
    with pytest.raises(ConfigError, match="replicas must be >= 1"):
        load_config(EngineConfig, data={"replicas": 0})


async def test_make_engine_builds_each_backend(tiny_model_dir):
    local = make_engine(EngineConfig(max_batch_size=2), str(tiny_model_dir))
    try:
        assert isinstance(local, LocalEngine) and isinstance(local, Engine)
        assert local.max_model_len == local.model.config.max_position_embeddings
    finally:
        await local.close()
    remote = make_engine(EngineConfig(backend="sglang", urls=["http://127.0.0.1:1"]), str(tiny_model_dir))
    assert isinstance(remote, SGLangEngine) and isinstance(remote, Engine)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        LocalEngine.from_pretrained(tiny_model_dir, EngineConfig(max_model_len=10**6))


def test_weight_sync_is_for_sglang_servers_and_defaults_to_disk():
    assert EngineConfig(backend="sglang", urls=["http://127.0.0.1:30000"]).weight_sync == "disk"
    assert EngineConfig(backend="sglang", urls=["http://127.0.0.1:30000"], weight_sync="broadcast").weight_sync == \
        "broadcast"
    with pytest.raises(ValueError, match="engine.weight_sync='broadcast' is for backend 'sglang'"):
        EngineConfig(weight_sync="broadcast")
