"""Rollout engines: the Engine protocol, the embedded LocalEngine, its replicas on Ray and the SGLang client."""

from __future__ import annotations

from agentrl.inference.base import Engine, EngineError, PromptTooLongError
from agentrl.inference.config import EngineConfig


def make_engine(config: EngineConfig, model_path: str) -> Engine:
    """Build the engine `config.backend` names. `model_path` is the HF model dir the local engine loads
    (the SGLang servers were launched with their own --model-path). Backend "local" with `config.replicas` > 1:
    that many LocalEngines in Ray actors behind one `ReplicatedEngine` (a local Ray starts unless one is up)."""
    if config.backend == "local" and config.replicas > 1:
        from agentrl.inference.replica_actor import start_replicas

        return start_replicas(model_path, config)
    if config.backend == "local":
        from agentrl.inference.local import LocalEngine

        return LocalEngine.from_pretrained(model_path, config)
    if config.backend == "sglang":
        from agentrl.inference.sglang import SGLangEngine

        return SGLangEngine(config.urls, config)
    raise ValueError(f"engine.backend {config.backend!r} is not 'local' or 'sglang'")


__all__ = ["Engine", "EngineError", "PromptTooLongError", "EngineConfig", "make_engine"]
