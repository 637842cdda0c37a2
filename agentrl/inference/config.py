"""Engine configuration (`engine:` section of a training config)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass
class EngineConfig:
    """How rollouts are generated.

    backend "local": a `LocalEngine` (transformers, continuous batching on a decode thread) in this process.
    backend "sglang": an `SGLangEngine` client for the servers in `urls` (started with
    `agentrl engine launch-sglang`, or `agentrl engine serve` for a CPU stand-in).

    KV-cache memory of the local engine is bounded by `max_batch_size * max_model_len` token slots:
    2 * layers * kv_heads * head_dim * bytes(dtype) per slot.
    """

    backend: Literal["local", "sglang"] = "local"

    # --- local engine ---
    device: str = "cpu"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"  # fp32 keeps logprobs equal to the trainer's
    max_batch_size: int = 32  # decode slots: requests decoded together in one forward pass
    max_model_len: int | None = None  # prompt + output tokens per request; None: the model's max positions
    max_queued_requests: int = 4096  # requests waiting for a slot; more raise EngineError("queue full")
    max_prefill_tokens: int = 4096  # prompt tokens prefilled per scheduler step (bounds prefill memory/latency)
    num_threads: int | None = None  # torch intra-op threads for the decode thread; None: torch's default
    prefix_cache_tokens: int = 32768  # KV of finished turns kept per session_id for the next turn; 0: off
    shared_prefix_cache_tokens: int = 16384  # KV of recent prompts, reused by prompts sharing a prefix; 0: off

    # --- sglang client ---
    urls: list[str] = field(default_factory=list)  # e.g. ["http://127.0.0.1:30000"]
    request_timeout_s: float = 600.0  # one /generate call
    connect_retries: int = 3  # retries on connection errors / 5xx before raising EngineError
    retry_backoff_s: float = 0.5  # first wait before a retry; doubles per retry, jittered (agentrl.retry), <= 30 s
    health_timeout_s: float = 600.0  # wait for every server's /health at start
    max_connections: int = 1024  # httpx connection pool size per server

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ValueError(f"engine.max_batch_size must be >= 1, got {self.max_batch_size}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"engine.max_model_len must be >= 2 or null (use the model's), got {self.max_model_len}")
        if self.max_queued_requests < 1:
            raise ValueError(f"engine.max_queued_requests must be >= 1, got {self.max_queued_requests}")
        if self.max_prefill_tokens < 1:
            raise ValueError(f"engine.max_prefill_tokens must be >= 1, got {self.max_prefill_tokens}")
        if self.prefix_cache_tokens < 0:
            raise ValueError(f"engine.prefix_cache_tokens must be >= 0 (0 disables it), got {self.prefix_cache_tokens}")
        if self.shared_prefix_cache_tokens < 0:
            raise ValueError(f"engine.shared_prefix_cache_tokens must be >= 0 (0 disables it), "
                             f"got {self.shared_prefix_cache_tokens}")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"engine.num_threads must be >= 1 or null, got {self.num_threads}")
        if self.request_timeout_s <= 0 or self.health_timeout_s <= 0:
            raise ValueError("engine.request_timeout_s and engine.health_timeout_s must be > 0")
        if self.retry_backoff_s < 0:
            raise ValueError(f"engine.retry_backoff_s must be >= 0, got {self.retry_backoff_s}")
        if self.connect_retries < 0:
            raise ValueError(f"engine.connect_retries must be >= 0, got {self.connect_retries}")
        if self.max_connections < 1:
            raise ValueError(f"engine.max_connections must be >= 1, got {self.max_connections}")
        for url in self.urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"engine.urls: {url!r} must start with http:// or https:// (e.g. http://127.0.0.1:30000)")
        if self.backend == "sglang" and not self.urls:
            raise ValueError("engine.backend is 'sglang' but engine.urls is empty: list the server URLs "
                             "(start them with `agentrl engine launch-sglang`)")


__all__ = ["EngineConfig"]
