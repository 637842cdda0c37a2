"""Agent-loop, rollout and reward configuration (`agent:`, `rollout:` and `reward:` sections)."""

from __future__ import annotations

import functools
import importlib.util
import inspect
from pathlib import Path
from typing import Any, Callable, ClassVar, Literal, get_args

from pydantic import Field, field_validator, model_validator

from agentrl.agent_loop.parsers import PARSERS
from agentrl.config import ConfigError, ConfigModel, import_object
from agentrl.envs.base import check_env_names


class AgentLoopConfig(ConfigModel):
    """One episode of the multi-turn agent (`ToolAgentLoop`, `agentrl.envs.loop.EnvAgentLoop`).

    Budgets count tokens. `max_response_tokens` covers everything after the prompt: sampled tokens, tool
    observations and template glue. The context window is `max_model_len` (None: the engine's `max_model_len`).
    """

    section: ClassVar[str] = "agent"

    max_assistant_turns: int = Field(8, ge=1)  # model turns per episode; reaching it ends the episode ("max_turns")
    max_response_tokens: int = Field(4096, ge=1)  # model + observation + glue tokens after the prompt
    max_new_tokens_per_turn: int = Field(1024, ge=1)  # cap on one engine.generate call
    max_tool_response_tokens: int = Field(512, ge=1)  # one tool observation is truncated (middle) to this many tokens
    max_parallel_calls: int = Field(4, ge=1)  # calls run concurrently per turn; later ones get an error observation
    tool_parser: str = "hermes"  # agentrl.agent_loop.parsers.PARSERS key
    tool_truncate_side: Literal["middle", "head", "tail"] = "middle"  # which part of a long observation is cut
    episode_timeout_s: float | None = Field(600.0, gt=0)  # wall clock per episode; None: no limit
    timeout_is_infra_error: bool = True  # a timed-out episode is left out of training (not rewarded 0)
    max_model_len: int | None = Field(None, ge=2)  # context window; None: the engine's (`engine.max_model_len`)
    # environments tasks may name in their `env` (besides the built-in ones): name -> "package.module:Class",
    # imported and checked against agentrl.envs.base.Env here, at config load
    envs: dict[str, str] = Field(default_factory=dict)

    @field_validator("envs")
    @classmethod
    def _env_classes(cls, envs: dict[str, str]) -> dict[str, str]:
        check_env_names(envs)
        return envs

    @field_validator("tool_parser")
    @classmethod
    def _known_parser(cls, name: str) -> str:
        if name not in PARSERS:
            raise ValueError(f"agent.tool_parser {name!r} is unknown; choose one of {sorted(PARSERS)}")
        return name


class RolloutConfig(ConfigModel):
    """Groups of episodes per task (`RolloutManager`)."""

    section: ClassVar[str] = "rollout"

    n: int = Field(8, ge=1)  # episodes per task, sharing one group uid
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = -1  # -1: off
    seed: int | None = None  # base sampling seed; each episode and turn derives its own (None: unseeded)
    max_concurrent_episodes: int = Field(64, ge=1)  # episodes in flight at once, across all engines
    dump_episodes: bool = True  # write run_dir/episodes.jsonl (every group member)
    # trainer.mode async: what new weights do to turns in flight. "continue": the turn goes on under the new
    # weights (its tokens keep the version that sampled each); "abort": the turn ends and the agent loop restarts it.
    on_weight_update: Literal["continue", "abort"] = "continue"
    # module:function of an agent program run per episode against the OpenAI-compatible policy front, instead of
    # the tool agent loop (`agentrl.agent_loop.agent_program`); null: ToolAgentLoop
    agent_program: str | None = None

    @field_validator("agent_program")
    @classmethod
    def _async_program(cls, spec: str | None) -> str | None:
        if spec is not None:
            load_agent_program(spec)
        return spec

    @field_validator("top_k")
    @classmethod
    def _off_or_positive(cls, top_k: int) -> int:
        if top_k == 0 or top_k < -1:
            raise ValueError(f"rollout.top_k must be -1 (off) or >= 1, got {top_k}")
        return top_k


class OverlongBufferConfig(ConfigModel):
    """`reward.overlong_buffer`: DAPO's soft overlong punishment (`agentrl.trainer.algos.overlong_penalty`).
    A response of L tokens (everything after the prompt) gets min(0, (agent.max_response_tokens - len - L) / len)
    * penalty_factor added to its reward: 0 up to max_response_tokens - len, -penalty_factor at the budget."""

    enable: bool = False
    len: int = Field(1024, ge=1)  # buffer length L_buf in tokens, <= agent.max_response_tokens
    penalty_factor: float = Field(1.0, ge=0)  # the penalty at the full budget, in reward units


RewardOnError = Literal["raise", "zero", "drop"]
REWARD_ON_ERROR = get_args(RewardOnError)  # reward.on_error values


class CustomRewardFunctionConfig(ConfigModel):
    """`reward.custom_reward_function` (verl's key): a function in a Python file that scores every row in verl's
    format instead of the data_source routing, called as verl calls it: fn(data_source=..., solution_str=...,
    ground_truth=..., extra_info=..., **reward_kwargs) -> float or {"score": float, ...}; may be async.
    Loaded and checked at config load (`agentrl.agent_loop.verl_reward`)."""

    path: str | None = None  # the .py file; null: verl rows are scored by their data_source
    name: str = "compute_score"  # the function in that file
    reward_kwargs: dict[str, Any] = Field(default_factory=dict)  # extra keywords, over the call's own

    @model_validator(mode="after")
    def _loads_and_accepts_verl_keywords(self) -> CustomRewardFunctionConfig:
        if self.path is not None:
            fn = load_custom_reward_function(self.path, self.name)
            try:
                inspect.signature(fn).bind(data_source="", solution_str="", ground_truth="", extra_info={},
                                           **self.reward_kwargs)
            except (TypeError, ValueError) as e:
                raise ConfigError(f"{self.name} in {self.path} must accept "
                                  f"(data_source, solution_str, ground_truth, extra_info) as keywords: {e}") from None
        return self


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


class RewardConfig(ConfigModel):
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

    section: ClassVar[str] = "reward"

    answer_from: Literal["answer_tag", "answer_tag_strict", "final_text"] = "answer_tag"
    sandbox_url: str | None = None  # for "unit_tests" rewards, e.g. http://127.0.0.1:8080
    sandbox_token_file: str | None = None  # the sandbox's token (its --token-file), sent as a bearer token
    unit_tests_timeout_s: float = Field(10.0, gt=0)  # run_timeout of one unit-test run in the sandbox
    score_unfinished: bool = False
    # code rewards: copies of a program already run (same code, tests and limits) take its verdict instead of
    # running again (`rewards.VerdictCache`); false runs every copy
    reuse_verdicts: bool = True
    custom: dict[str, str] = Field(default_factory=dict)
    verl_reward_type: str = "verl"
    custom_reward_function: CustomRewardFunctionConfig = Field(default_factory=CustomRewardFunctionConfig)
    overlong_buffer: OverlongBufferConfig = Field(default_factory=OverlongBufferConfig)
    on_error: RewardOnError = "raise"

    @field_validator("sandbox_url")
    @classmethod
    def _http_url(cls, url: str | None) -> str | None:
        if url is not None and not url.startswith(("http://", "https://")):
            raise ValueError(f"reward.sandbox_url {url!r} must start with http:// or https://")
        return url

    @field_validator("custom")
    @classmethod
    def _callable_rewards(cls, custom: dict[str, str]) -> dict[str, str]:
        for name, spec in custom.items():
            check_reward_fn(import_object(spec, f"reward.custom.{name}"), f"reward.custom.{name} ({spec})")
        return custom


def load_agent_program(spec: str) -> Callable:
    """The `module:function` agent program, checked to be an async function of (task, base_url, episode_id)."""
    fn = import_object(spec, "rollout.agent_program")
    if not inspect.iscoroutinefunction(fn):
        raise ConfigError(f"rollout.agent_program {spec} must be an async function: async def run(task, base_url, "
                          "episode_id)")
    try:
        inspect.signature(fn).bind(None, "", "")
    except (TypeError, ValueError) as e:
        raise ConfigError(f"rollout.agent_program {spec} must accept (task, base_url, episode_id): {e}") from None
    return fn


def check_reward_fn(fn, what: str) -> None:
    """Fail unless `fn` can be called as fn(task, episode, config)."""
    if not callable(fn):
        raise ConfigError(f"{what} is not callable")
    try:
        inspect.signature(fn).bind(None, None, None)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{what} must accept (task, episode, config): {e}") from None


__all__ = ["AgentLoopConfig", "CustomRewardFunctionConfig", "OverlongBufferConfig", "REWARD_ON_ERROR", "RolloutConfig",
           "RewardConfig", "check_reward_fn", "load_agent_program", "load_custom_reward_function"]
