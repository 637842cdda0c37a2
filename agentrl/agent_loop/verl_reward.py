"""Reward type "verl": rows in verl's format, scored as verl scores them.

`agentrl.data.tasks` reads a verl row's reward as {"type": "verl", "ground_truth": ..., "data_source": ...};
`resolve_verl_reward` (reached through `rewards.resolve_reward_fn`, so when `agentrl train` checks the task files
before it starts, and for every episode) picks the function that scores it:

1. `reward.custom_reward_function.path` set: that function, for every verl row, called as verl calls it:
   fn(data_source=, solution_str=, ground_truth=, extra_info=, **reward_kwargs); extra_info is the row's, plus
   `num_turns` as verl adds it. A number is the reward; of a dict, "score" is, and the dict goes to
   `episode.metrics["reward_info"]`.
2. `reward.verl_reward_type` other than "verl": that agentrl reward type (exact_match, numeric, ...) for every row.
3. Otherwise the row's data_source, as verl's `default_compute_score` routes it (`verl_scores.verl_scorer`): GSM8K,
   MATH, DAPO math (its {"score", "acc", "pred"} go to reward_info), search-R1 QA, and code. A data_source verl
   has no score for, or one agentrl lacks verl's scorer for, is a RewardSpecError naming it and the two fixes.

The solution text is the final assistant message of an episode that ended on its own (`rewards.answer_text`); an
episode cut at a limit is scored as an empty response (0, or -1 for DAPO math) unless `reward.score_unfinished`.
verl decodes the whole response instead, every turn of it; for single-turn rows the two are the same text.

Code rows (codecontests, apps, codeforces, taco) hold verl's test JSON, {"inputs": [...], "outputs": [...]} or
{"assert_case": [...]}. As verl's sandbox score with `continuous=True`, the answer needs a fenced code block and
scores the share of the first 10 cases it passes; each case runs through agentrl's sandbox rewards
(`stdin_stdout`, or `unit_tests` for an assert case) at `reward.sandbox_url`, so the verdict cache and the
hack-proof harness apply. Unlike verl, stdout is compared whitespace-normalised, a sandbox fault makes the episode
infra_error instead of scoring 0, and call-based tests (`fn_name`) are refused with an error.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from typing import Any

from agentrl.agent_loop.config import RewardConfig, load_custom_reward_function
from agentrl.agent_loop.rewards import (
    RewardFn,
    RewardSpecError,
    answer_text,
    resolve_reward_fn,
    stdin_stdout,
    unit_tests,
)
from agentrl.agent_loop.verl_scores import SCORERS, UNSUPPORTED_SOURCES, verl_scorer
from agentrl.types import Episode, Task

CODE_CASES_SCORED = 10  # verl's continuous code score is the pass rate of the first 10 cases

_FIXES = ("score these rows with reward.verl_reward_type=TYPE (exact_match, numeric or package.module:function) or "
          "with your own verl function, reward.custom_reward_function.path=FILE.py (and .name=FUNCTION)")


def resolve_verl_reward(spec: dict, config: RewardConfig, where: str) -> RewardFn:
    """The function that scores a "verl" reward spec under `config`; RewardSpecError naming `where` and the fix."""
    missing = [f for f in ("ground_truth", "data_source") if f not in spec]
    if missing:
        raise RewardSpecError(f"{where}: reward type 'verl' needs field(s) {missing}")
    if config.custom_reward_function.path is not None:
        return custom_function_reward
    if config.verl_reward_type != "verl":
        return resolve_reward_fn({**spec, "type": config.verl_reward_type}, config,
                                 where=f"{where} (reward.verl_reward_type)")
    source = spec["data_source"]
    kind = verl_scorer(source) if isinstance(source, str) else None
    if kind is None and source in UNSUPPORTED_SOURCES:
        raise RewardSpecError(f"{where}: verl scores data_source {source!r} with its {UNSUPPORTED_SOURCES[source]} "
                              f"scorer, which agentrl does not have; {_FIXES}")
    if kind is None:
        raise RewardSpecError(f"{where}: data_source {source!r} has no verl score (verl's default_compute_score "
                              "knows openai/gsm8k, the MATH sources, math_dapo, math, aime*, searchR1_* and "
                              f"codecontests, apps, codeforces, taco); {_FIXES}")
    if kind == "code":
        code_cases(spec["ground_truth"], where)
        if config.sandbox_url is None:
            raise RewardSpecError(f"{where}: data_source {source!r} is scored by running the answer's code in the "
                                  "sandbox, but reward.sandbox_url is not set (e.g. "
                                  "reward.sandbox_url=http://127.0.0.1:8080)")
        return code_reward
    if kind == "search_r1" and not (isinstance(spec["ground_truth"], dict) and "target" in spec["ground_truth"]):
        raise RewardSpecError(f"{where}: data_source {source!r} needs ground_truth {{'target': [answers]}} (verl's "
                              f"search-R1 format), got {spec['ground_truth']!r:.100}")
    return rule_reward


def solution_text(episode: Episode, config: RewardConfig) -> str:
    """verl's solution_str: the final answer of a finished episode, "" for one cut at a limit."""
    text = answer_text(episode, config)
    return "" if text is None else text


def record_score(episode: Episode, result: Any, what: str) -> float:
    """The reward of a verl score (a number, or a dict with "score" that is kept as the episode's reward_info)."""
    if isinstance(result, dict):
        if "score" not in result:
            raise RewardSpecError(f"{what} returned a dict without 'score' (keys {sorted(result)})")
        episode.metrics["reward_info"] = result
        return float(result["score"])
    if isinstance(result, (bool, int, float)):
        return float(result)
    raise RewardSpecError(f"{what} returned a {type(result).__name__}; it must return a number or a dict with "
                          "'score'")


def rule_reward(task: Task, episode: Episode, config: RewardConfig) -> float:
    """The rule score verl gives the row's data_source (GSM8K, MATH, DAPO math, search-R1)."""
    spec = task.reward
    scorer = SCORERS[verl_scorer(spec["data_source"])]
    return record_score(episode, scorer(solution_text(episode, config), spec["ground_truth"]),
                        f"verl score for {spec['data_source']!r}")


async def custom_function_reward(task: Task, episode: Episode, config: RewardConfig) -> float:
    """`reward.custom_reward_function`, called with verl's keywords (reward_kwargs take precedence)."""
    fn_config = config.custom_reward_function
    fn = load_custom_reward_function(fn_config.path, fn_config.name)
    extra_info = {**(task.extra.get("extra_info") or {}), "num_turns": episode.num_turns}
    call = {"data_source": task.reward["data_source"], "solution_str": solution_text(episode, config),
            "ground_truth": task.reward["ground_truth"], "extra_info": extra_info}
    result = fn(**{**call, **fn_config.reward_kwargs})
    if inspect.isawaitable(result):
        result = await result
    return record_score(episode, result, f"reward.custom_reward_function {fn_config.name} ({fn_config.path})")


def code_cases(ground_truth: Any, where: str) -> list[dict]:
    """verl's code tests as agentrl cases: {"input", "output"} per stdin/stdout case, {"tests"} per assert case."""
    tests = ground_truth
    if isinstance(tests, str):
        try:
            tests = json.loads(tests)
        except json.JSONDecodeError as e:
            raise RewardSpecError(f"{where}: code ground_truth is not JSON ({e.msg}); verl's code rows hold "
                                  "'{\"inputs\": [...], \"outputs\": [...]}'") from None
    if not isinstance(tests, dict):
        raise RewardSpecError(f"{where}: code ground_truth must be a JSON object with 'inputs' and 'outputs', got "
                              f"{type(tests).__name__}")
    if tests.get("fn_name"):
        raise RewardSpecError(f"{where}: call-based code tests (fn_name {tests['fn_name']!r}) are not supported; "
                              "agentrl runs stdin/stdout and assert_case tests; score these rows with "
                              "reward.custom_reward_function.path=FILE.py")
    asserts = tests.get("assert_case")
    if isinstance(asserts, list) and asserts and all(isinstance(a, str) for a in asserts):
        return [{"tests": a} for a in asserts]
    inputs, outputs = tests.get("inputs"), tests.get("outputs")
    if not (isinstance(inputs, list) and isinstance(outputs, list) and inputs and len(inputs) == len(outputs)):
        raise RewardSpecError(f"{where}: code ground_truth needs 'inputs' and 'outputs' lists of the same, non-zero "
                              "length (or an 'assert_case' list of test strings)")
    return [{"input": i, "output": o} for i, o in zip(inputs, outputs)]


async def _run_case(task: Task, episode: Episode, config: RewardConfig, case: dict) -> tuple[float, dict]:
    """One case through agentrl's sandbox reward, on a copy of the episode whose reward_info is this case's."""
    probe = dataclasses.replace(episode, metrics={})
    if "tests" in case:
        reward = await unit_tests(dataclasses.replace(task, reward={"type": "unit_tests", "tests": case["tests"]}),
                                  probe, config)
    else:
        reward = await stdin_stdout(dataclasses.replace(task, reward={"type": "stdin_stdout", "cases": [case]}),
                                    probe, config)
    return reward, probe.metrics["reward_info"]


async def code_reward(task: Task, episode: Episode, config: RewardConfig) -> float:
    """The share of the first 10 test cases the answer's code passes; 0 without a fenced code block."""
    cases = code_cases(task.reward["ground_truth"], f"task {task.task_id!r}")[:CODE_CASES_SCORED]
    text = answer_text(episode, config)
    if text is None or "```" not in text:
        why = "no fenced code block" if text is not None else f"the episode did not finish ({episode.finish_reason})"
        episode.metrics["reward_info"] = {"score": 0.0, "passed": 0, "total": len(cases), "error": why}
        return 0.0
    # one case at a time, as stdin_stdout runs its cases: episodes already fill the sandbox (rollout concurrency),
    # and ten runs at once per episode would overload it into infra errors
    results = [await _run_case(task, episode, config, case) for case in cases]
    passed = sum(1 for reward, _ in results if reward == 1.0)
    score = passed / len(cases)
    episode.metrics["reward_info"] = {"score": score, "passed": passed, "total": len(cases),
                                      "cases": [info for _, info in results]}
    return score


__all__ = ["CODE_CASES_SCORED", "code_cases", "code_reward", "custom_function_reward", "record_score",
           "resolve_verl_reward", "rule_reward", "solution_text"]
