"""Records shared across packages: tasks, sampling parameters, generations, tool calls and episodes.

These are plain dataclasses so that they cross process boundaries (Ray, JSONL dumps) without ceremony.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

FINISH_REASONS_GENERATION = ("stop", "length", "abort")
FINISH_REASONS_EPISODE = ("stop", "length", "max_turns", "timeout", "infra_error")


@dataclass
class Task:
    """One prompt to roll out `rollout.n` times.

    `prompt` is a list of OpenAI-format messages. `tools` names the tools the agent may call (None: every tool
    of the registry). `reward` is the reward spec, e.g. {"type": "answer_match", "ground_truth": "42"}.
    `tools_kwargs` carries per-task arguments for stateful tools (e.g. a knowledge-base id).
    `env`: {"name": ..., "kwargs": {...}} when an environment (`agentrl.envs`), not tools, answers the model's
    turns; None for a tool task.
    """

    prompt: list[dict]
    reward: dict = field(default_factory=dict)
    tools: list[str] | None = None
    data_source: str = "unknown"
    tools_kwargs: dict = field(default_factory=dict)
    task_id: str = ""
    extra: dict = field(default_factory=dict)
    env: dict | None = None


@dataclass
class SamplingParams:
    """How one turn is sampled (SGLang's sampling_params of the same names; `seed` is its `sampling_seed`).

    `ignore_eos`: do not stop at the model's EOS tokens nor at `stop_token_ids` (stop strings still stop), as
    SGLang. `min_new_tokens`: until that many tokens were generated, EOS and `stop_token_ids` are masked out of
    the distribution (the logprobs are those of the masked distribution the token was drawn from).
    """

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop_token_ids: list[int] = field(default_factory=list)
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    ignore_eos: bool = False
    min_new_tokens: int = 0

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"SamplingParams.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"SamplingParams.top_k must be -1 (off) or >= 1, got {self.top_k}")
        if not 0 <= self.min_new_tokens <= self.max_new_tokens:
            raise ValueError(f"SamplingParams.min_new_tokens must be in [0, max_new_tokens={self.max_new_tokens}], "
                             f"got {self.min_new_tokens}")


@dataclass
class Generation:
    token_ids: list[int]  # sampled ids, including the stop token that ended the turn
    logprobs: list[float]  # log p(token) under log_softmax(logits / temperature); same length
    finish_reason: str  # "stop" | "length" | "abort"
    metrics: dict = field(default_factory=dict)  # e.g. queue_s, decode_s, weight_version
    # The engine's weight version that sampled each token, one per token_ids entry; empty when the engine cannot
    # say (then metrics["weight_version"] stands for every token).
    weight_versions: list[int] = field(default_factory=list)


@dataclass
class ToolCall:
    """A tool call parsed from a model turn. `error` is set when parsing failed (malformed JSON, no name)."""

    name: str
    arguments: dict
    call_id: str = ""
    raw: str = ""
    error: str | None = None


@dataclass
class Episode:
    uid: str  # group id: all n episodes of one task share it
    prompt_ids: list[int]
    response_ids: list[int]  # everything after the prompt: model turns, tool observations, template glue
    response_mask: list[int]  # 1 = sampled by the policy, 0 = everything else; len == len(response_ids)
    response_logprobs: list[float]  # rollout logprobs, 0.0 where mask is 0
    messages: list[dict]  # OpenAI-format transcript (assistant tool_calls, tool results)
    reward: float = 0.0
    finish_reason: str = "stop"  # "stop" | "length" | "max_turns" | "timeout" | "infra_error"
    num_turns: int = 0
    tool_calls: list[dict] = field(default_factory=list)  # name, arguments, ok, error kind, latency_s, per call
    infra_error: bool = False  # a tool/sandbox/engine fault (not the policy) ruined the episode
    metrics: dict = field(default_factory=dict)
    task_id: str = ""
    data_source: str = "unknown"
    # Index of the assistant turn each response token belongs to (-1 for observation/glue tokens); used for
    # per-turn logprob drift metrics.
    turn_ids: list[int] = field(default_factory=list)
    # The weight version that sampled each response token (-1 where the mask is 0), aligned with response_ids;
    # empty when the engine did not report versions (and in episodes written before they were recorded).
    response_versions: list[int] = field(default_factory=list)
    # What `agentrl replay` needs (agentrl/agent_loop/replay.py). `episode_id`: unique per episode
    # (f"{uid}-{sample_index}" as written by the rollout, before a trainer's refill suffix). `turns`: one dict
    # per engine call: the SamplingParams sent (seed included), the token count, finish_reason, the weight
    # version the engine reported and, where it says, the server that answered (`server`: an SGLang server's URL,
    # or the index of an `engine.replicas` replica). `replay`: the engine (class, model, weight version), the
    # task's tool names, tool schemas and tools_kwargs, how many messages the prompt had, and the agent config.
    # Each tool_calls record also carries `response` (the registry's raw reply, before truncation).
    episode_id: str = ""
    turns: list[dict] = field(default_factory=list)
    replay: dict = field(default_factory=dict)
    # Rewards an environment gave along the way (`agentrl.envs`): turn_rewards[i] came after model turn i (its
    # tokens have turn_ids == i). `reward` is the whole return: the outcome score plus their sum; the trainer puts
    # each on its turn's last policy token and the rest of `reward` on the episode's last one.
    turn_rewards: list[float] = field(default_factory=list)

    def check(self) -> None:
        """Raise ValueError if the token-aligned lists disagree in length or mask values are not 0/1."""
        n = len(self.response_ids)
        for name in ("response_mask", "response_logprobs"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"episode {self.uid}: len({name})={len(getattr(self, name))} != len(response_ids)={n}")
        for name in ("turn_ids", "response_versions"):  # optional: empty when not recorded
            values = getattr(self, name)
            if values and len(values) != n:
                raise ValueError(f"episode {self.uid}: len({name})={len(values)} != len(response_ids)={n}")
        if any(m not in (0, 1) for m in self.response_mask):
            raise ValueError(f"episode {self.uid}: response_mask must hold only 0 and 1")

    def to_dict(self) -> dict[str, Any]:
        """The fields as a dict for JSON, sharing (not copying) the lists and dicts they hold: `asdict`'s deep
        copy of every token list was ~4% of a rollout's CPU on the tiny model. Copy before mutating nested values."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Episode":
        """An Episode from `to_dict()`'s fields; other keys (an episodes.jsonl row's `step`, `sample_index`) are
        left out."""
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})
