"""The rollout engine contract: token ids in, token ids + logprobs out.

Every agent turn is one `Engine.generate(input_ids, params)` call. Implementations:

- `agentrl.inference.local.LocalEngine`: transformers model in this process, continuous batching on a
  background decode thread (CPU default, usable on one GPU).
- `agentrl.inference.sglang.SGLangEngine`: HTTP client for one or more SGLang servers (GPU clusters), or for
  `agentrl engine serve` (the same wire format served by a LocalEngine).
- `agentrl.inference.replicas.ReplicatedEngine`: N LocalEngines in Ray actors (`engine.replicas`), an episode's
  turns on one of them, new episodes on the least loaded, a dead one's requests retried on another.

Logprobs are `log_softmax(logits / temperature)` of each sampled token, computed before top-p/top-k filtering,
the same definition the trainer uses (`agentrl.trainer.algos.logprobs_from_logits`). With temperature 0
(greedy) the logprobs are reported under temperature 1.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from agentrl.errors import UserError
from agentrl.types import Generation, SamplingParams


class EngineError(RuntimeError):
    """An engine or infrastructure fault (server down, queue full, request aborted, engine closed).

    The agent loop turns it into an `infra_error` episode: it is not the policy's fault.
    """


class PromptTooLongError(EngineError):
    """The prompt does not fit the context window (`max_model_len`); shorten it or raise the limit."""


class ModelNotFoundError(UserError, FileNotFoundError):
    """The model path is not a Hugging Face model directory (no config.json)."""


@runtime_checkable
class Engine(Protocol):
    """What the agent loop and the trainer need from a rollout engine."""

    async def generate(self, input_ids: list[int], params: SamplingParams, *,
                       session_id: str | None = None) -> Generation:
        """Continue `input_ids` under `params`.

        Returns the sampled ids (including the stop token that ended the turn), one logprob per id, the weight
        version that sampled each id where the engine can tell (`weight_versions`) and `finish_reason` in
        {"stop", "length", "abort"}. `session_id` (e.g. the episode id) lets multi-server
        engines send every turn of an episode to the same server so its prefix cache is reused.
        Raises `PromptTooLongError` when the prompt does not fit and `EngineError` for infrastructure faults.
        """
        ...

    async def update_weights(self, weights, *, version: int | None = None) -> None:
        """Swap in new policy weights: a state dict (LocalEngine) or a checkpoint directory (SGLang). `version`
        numbers them (the trainer passes the step that made them); tokens they sample report it."""
        ...


__all__ = ["Engine", "EngineError", "ModelNotFoundError", "PromptTooLongError"]
