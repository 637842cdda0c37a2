"""Agent-loop, rollout and reward configuration (`agent:`, `rollout:` and `reward:` sections)."""

from __future__ import annotations

import functools
import importlib.util
import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, get_args

from agentrl.agent_loop.parsers import PARSERS
from agentrl.config import ConfigError, import_object


@dataclass
class AgentLoopConfig:
    """One episode of the multi-turn tool agent (`ToolAgentLoop`).

    Budgets count tokens. `max_response_tokens` covers everything after the prompt: sampled tokens, tool
    observations and template glue. The context window is `max_model_len` (None: the engine's `max_model_len`).
    """

    max_assistant_turns: int = 8  # model turns per episode; reaching it ends the episode ("max_turns")
    max_response_tokens: int = 4096  # model + observation + glue tokens after the prompt
    max_new_tokens_per_turn: int = 1024  # cap on one engine.generate call
    max_tool_response_tokens: int = 512  # one tool observation is truncated (middle) to this many tokens
    max_parallel_calls: int = 4  # calls run concurrently per turn; later calls in the turn get an error observation
    tool_parser: str = "hermes"  # agentrl.agent_loop.parsers.PARSERS key
    tool_truncate_side: Literal["middle", "head", "tail"] = "middle"  # which part of a long observation is cut
    episode_timeout_s: float | None = 600.0  # wall clock per episode; None: no limit
    timeout_is_infra_error: bool = True  # a timed-out episode is left out of training (not rewarded 0)
    max_model_len: int | None = None  # context window; None: take it from the engine (`engine.max_model_len`)

    def __post_init__(self) -> None:
        for name in ("max_assistant_turns", "max_response_tokens", "max_new_tokens_per_turn",
                     "max_tool_response_tokens", "max_parallel_calls"):
            if getattr(self, name) < 1:
                raise ValueError(f"agent.{name} must be >= 1, got {getattr(self, name)}")
        if self.tool_parser not in PARSERS:
            raise ValueError(f"agent.tool_parser {self.tool_parser!r} is unknown; choose one of {sorted(PARSERS)}")
        if self.episode_timeout_s is not None and self.episode_timeout_s <= 0:
            raise ValueError(f"agent.episode_timeout_s must be > 0 or null (no limit), got {self.episode_timeout_s}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"agent.max_model_len must be >= 2 or null, got {self.max_model_len}")


@dataclass
class RolloutConfig:
    """Groups of episodes per task (`RolloutManager`)."""

    n: int = 8  # episodes per task, sharing one group uid
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: off
    seed: int | None = None  # base sampling seed; each episode and turn derives its own (None: unseeded)
    max_concurrent_episodes: int = 64  # episodes in flight at once, across all engines
    dump_episodes: bool = True  # write run_dir/episodes.jsonl (every group member)

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"rollout.n must be >= 1, got {self.n}")
        if self.temperature < 0:
            raise ValueError(f"rollout.temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"rollout.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"rollout.top_k must be -1 (off) or >= 1, got {self.top_k}")
        if self.max_concurrent_episodes < 1:
            raise ValueError(f"rollout.max_concurrent_episodes must be >= 1, got {self.max_concurrent_episodes}")


@dataclass
class OverlongBufferConfig:
    """`reward.overlong_buffer`: DAPO's soft overlong punishment (`agentrl.trainer.algos.overlong_penalty`).
    A response of L tokens (everything after the prompt) gets min(0, (agent.max_response_tokens - len - L) / len)
    * penalty_factor added to its reward: 0 up to max_response_tokens - len, -penalty_factor at the budget."""

    enable: bool = False
    len: int = 1024  # buffer length L_buf in tokens, <= agent.max_response_tokens
    penalty_factor: float = 1.0  # the penalty at the full budget, in reward units

    def __post_init__(self) -> None:
        if self.len < 1 or self.penalty_factor < 0:
            raise ValueError(f"reward.overlong_buffer needs len >= 1 and penalty_factor >= 0, got len={self.len}, "
                             f"penalty_factor={self.penalty_factor}")


RewardOnError = Literal["raise", "zero", "drop"]
REWARD_ON_ERROR = get_args(RewardOnError)  # reward.on_error values


@dataclass
class CustomRewardFunctionConfig:
    """`reward.custom_reward_function` (verl's key): a function in a Python file that scores every row in verl's
    format instead of the data_source routing, called as verl calls it: fn(data_source=..., solution_str=...,
    ground_truth=..., extra_info=..., **reward_kwargs) -> float or {"score": float, ...}; may be async.
    Loaded and checked at config load (`agentrl.agent_loop.verl_reward`)."""

    path: str | None = None  # the .py file; null: verl rows are scored by their data_source
    name: str = "compute_score"  # the function in that file
    reward_kwargs: dict[str, Any] = field(default_factory=dict)  # extra keywords, over the call's own

    def __post_init__(self) -> None:
        if self.path is not None:
            fn = load_custom_reward_function(self.path, self.name)
            try:
                inspect.signature(fn).bind(data_source="", solution_str="", ground_truth="", extra_info={},
                                           **self.reward_kwargs)
            except (TypeError, ValueError) as e:
                raise ConfigError(f"{self.name} in {self.path} must accept "
                                  f"(data_source, solution_str, ground_truth, extra_info) as keywords: {e}") from None


@functools.lru_cache(maxsize=None)
def load_custom_reward_function(path: str, name: str) -> Callable:
    """Function `name` of the Python file `path` (run once per process); ConfigError naming the file and the fix
    (raised while `reward.custom_reward_function` loads, which prefixes that key)."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"path {path} does not exist; give the .py file that defines your reward function")
    spec = importlib.util.spec_from_file_location(f"agentrl_custom_reward_{file.stem}", file)
    if spec is None or spec.loader is None:
        raise ConfigError(f"path {path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except (SyntaxError, ImportError) as e:
        raise ConfigError(f"cannot load {path} ({type(e).__name__}: {e})") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ConfigError(f"{path} defines no function {name!r}; set reward.custom_reward_function.name to the "
                          "function's name")
    return fn


@dataclass
class RewardConfig:
    """How episodes are scored (`agentrl.agent_loop.rewards`).

    `answer_from`: "answer_tag" reads <answer>...</answer> from the final assistant turn and falls back to its
    whole text; "answer_tag_strict" scores 0 when the tag is missing; "final_text" always uses the whole text.
    `score_unfinished`: false (default) gives 0 to an episode that did not end on its own (cut by
    max_new_tokens_per_turn, max_response_tokens, the context window, max_assistant_turns or the episode timeout):
    its last message is not a finished answer. True scores that message as it stands, right answer and all.
    `custom` maps extra reward type names to `module:fn` callables `fn(task, episode, config) -> float` (may be
    async); they are imported and checked here, at config load.
    `on_error`: what happens when the reward code itself raises (a bug in the grader, not a sandbox fault, which
    is an infrastructure failure): "raise" stops at the first one (`rewards.RewardError`); "zero" scores the
    episode 0 (a policy failure) and trains on it; "drop" leaves the episode's whole group out of the step.
    Rows in verl's format (`reward_model`) have reward type "verl": `verl_reward_type` "verl" scores each as
    verl's default_compute_score does, by its data_source; another reward type (exact_match, numeric, a
    reward.custom name, module:fn) scores them all; `custom_reward_function` (verl's key) overrides both.
    """

    answer_from: Literal["answer_tag", "answer_tag_strict", "final_text"] = "answer_tag"
    sandbox_url: str | None = None  # for "unit_tests" rewards, e.g. http://127.0.0.1:8080
    unit_tests_timeout_s: float = 10.0  # run_timeout of one unit-test run in the sandbox
    score_unfinished: bool = False
    # code rewards: copies of a program already run (same code, tests and limits) take its verdict instead of
    # running again (`rewards.VerdictCache`); false runs every copy
    reuse_verdicts: bool = True
    custom: dict[str, str] = field(default_factory=dict)
    verl_reward_type: str = "verl"
    custom_reward_function: CustomRewardFunctionConfig = field(default_factory=CustomRewardFunctionConfig)
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)
    on_error: RewardOnError = "raise"

    def __post_init__(self) -> None:
        if self.on_error not in REWARD_ON_ERROR:
            raise ValueError(f"reward.on_error {self.on_error!r} is unknown; choose one of "
                             f"{', '.join(REWARD_ON_ERROR)}")
        if self.unit_tests_timeout_s <= 0:
            raise ValueError(f"reward.unit_tests_timeout_s must be > 0, got {self.unit_tests_timeout_s}")
        if self.sandbox_url is not None and not self.sandbox_url.startswith(("http://", "https://")):
            raise ValueError(f"reward.sandbox_url {self.sandbox_url!r} must start with http:// or https://")
        for name, spec in self.custom.items():
            check_reward_fn(import_object(spec, f"reward.custom.{name}"), f"reward.custom.{name} ({spec})")


def check_reward_fn(fn, what: str) -> None:
    """Fail unless `fn` can be called as fn(task, episode, config)."""
    if not callable(fn):
        raise ConfigError(f"{what} is not callable")
    try:
        inspect.signature(fn).bind(None, None, None)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{what} must accept (task, episode, config): {e}") from None


__all__ = ["AgentLoopConfig", "CustomRewardFunctionConfig", "OverlongBufferConfig", "REWARD_ON_ERROR", "RolloutConfig",
           "RewardConfig", "check_reward_fn", "load_custom_reward_function"]
