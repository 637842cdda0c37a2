"""Engine configuration (`engine:` section of a training config)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from agentrl.config import ConfigModel


class EngineConfig(ConfigModel):
    """How rollouts are generated.

    backend "local": a `LocalEngine` (transformers, continuous batching on a decode thread) in this process; with
    `replicas` > 1, that many LocalEngines, each in a Ray actor (`agentrl.inference.replicas.ReplicatedEngine`).
    backend "sglang": an `SGLangEngine` client for the servers in `urls` (started with
    `agentrl engine launch-sglang`, or `agentrl engine serve` for a CPU stand-in).

    KV-cache memory of the local engine is bounded by `max_batch_size * max_model_len` token slots:
    2 * layers * kv_heads * head_dim * bytes(dtype) per slot.
    """

    section: ClassVar[str] = "engine"

    backend: Literal["local", "sglang"] = "local"

    # --- local engine ---
    device: str = "cpu"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"  # fp32 keeps logprobs equal to the trainer's
    max_batch_size: int = Field(32, ge=1)  # decode slots: requests decoded together in one forward pass
    max_model_len: int | None = Field(None, ge=2)  # prompt + output tokens per request; None: the model's maximum
    max_queued_requests: int = Field(4096, ge=1)  # requests waiting for a slot; more raise EngineError("queue full")
    max_prefill_tokens: int = Field(4096, ge=1)  # prompt tokens prefilled per scheduler step (bounds prefill memory)
    num_threads: int | None = Field(None, ge=1)  # torch intra-op threads for the decode thread; None: torch's default
    prefix_cache_tokens: int = Field(32768, ge=0)  # KV of finished turns kept per session_id for the next turn; 0: off
    shared_prefix_cache_tokens: int = Field(16384, ge=0)  # KV of recent prompts, reused by shared prefixes; 0: off

    # --- engine replicas (backend "local"; for "sglang" the replicas are the servers in `urls`, routed alike) ---
    # LocalEngines, each a Ray actor wherever the cluster has room (1 CPU thread and Ray CPU each unless num_threads
    # says more); an episode's turns stay on one replica, new episodes go to the least loaded. 1: in this process
    replicas: int = Field(1, ge=1)
    replica_resources: dict[str, float] = Field(default_factory=dict)  # custom Ray resources each replica asks for
    replica_timeout_s: float = Field(300.0, gt=0)  # a replica's start, health check or weight update; then EngineError
    max_replica_retries: int = Field(2, ge=0)  # a request whose replica died is retried on another this many times

    # --- sglang client ---
    urls: list[str] = Field(default_factory=list)  # e.g. ["http://127.0.0.1:30000"]
    request_timeout_s: float = Field(600.0, gt=0)  # one /generate call
    connect_retries: int = Field(3, ge=0)  # retries on connection errors / 5xx before raising EngineError
    retry_backoff_s: float = Field(0.5, ge=0)  # first wait before a retry; doubles per retry, jittered, <= 30 s
    health_timeout_s: float = Field(600.0, gt=0)  # wait for every server's /health at start
    max_connections: int = Field(1024, ge=1)  # httpx connection pool size per server
    # how new weights reach the servers after each step: "broadcast" (trainer rank 0 joins a process group with
    # every server and broadcasts the tensors, bucketed: NCCL on GPUs, gloo on CPU; the servers must reach rank 0's
    # node) or "disk" (an HF checkpoint under trainer.run_dir/weights that every server loads: a shared filesystem)
    weight_sync: Literal["broadcast", "disk"] = "disk"
    weight_bucket_mb: float = Field(256.0, gt=0)  # broadcast: tensors per HTTP call to each server, about this many MiB
    weight_flatten_buckets: bool = False  # broadcast each bucket as one flat tensor (fewer collectives) not per tensor
    # how a LoRA policy (actor.lora) reaches the servers: "merged" (the adapter merged into full weights, sent as
    # engine.weight_sync says) or "adapter" (only the adapter, loaded with SGLang's /load_lora_adapter under a new
    # name per step, `agentrl.trainer.lora_sync`; servers started with `engine launch-sglang --lora-rank R`)
    lora_sync: Literal["merged", "adapter"] = "merged"
    # the servers' token (SGLang's --api-key, `agentrl engine serve --token-file`), sent as Authorization: Bearer
    token_file: str | None = None

    @field_validator("urls")
    @classmethod
    def _http_urls(cls, urls: list[str]) -> list[str]:
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"engine.urls: {url!r} must start with http:// or https:// "
                                 "(e.g. http://127.0.0.1:30000)")
        return urls

    @model_validator(mode="after")
    def _sglang_needs_urls(self) -> EngineConfig:
        if self.backend == "sglang" and not self.urls:
            raise ValueError("engine.backend is 'sglang' but engine.urls is empty: list the server URLs "
                             "(start them with `agentrl engine launch-sglang`)")
        if self.backend != "sglang" and self.weight_sync != "disk":
            raise ValueError(f"engine.weight_sync={self.weight_sync!r} is for backend 'sglang'; the local engine gets "
                             "the weights in memory: leave engine.weight_sync out")
        if self.backend != "sglang" and self.lora_sync != "merged":
            raise ValueError(f"engine.lora_sync={self.lora_sync!r} loads adapters on SGLang servers (engine.backend "
                             "'sglang'); the local engine gets merged weights in memory: leave engine.lora_sync out")
        if self.backend == "sglang" and self.replicas > 1:
            raise ValueError(f"engine.replicas={self.replicas} is for backend 'local'; with 'sglang' every server in "
                             "engine.urls is a replica: list them there and leave engine.replicas at 1")
        return self


__all__ = ["EngineConfig"]
