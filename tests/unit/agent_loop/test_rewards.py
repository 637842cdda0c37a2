from __future__ import annotations

import pytest

from agentrl.agent_loop.config import RewardConfig
from agentrl.agent_loop.rewards import (
    RewardSpecError,
    check_reward_specs,
    compute_reward,
    extract_answer,
    extract_code,
    parse_number,
)
from agentrl.config import ConfigError
from agentrl.types import Episode, Task


def episode(final: str) -> Episode:
    return Episode(uid="u", prompt_ids=[], response_ids=[], response_mask=[], response_logprobs=[],
                   messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": "draft <answer>0"},
                             {"role": "tool", "content": "x"}, {"role": "assistant", "content": final}])


def task(**reward) -> Task:
    return Task(prompt=[{"role": "user", "content": "q"}], reward=reward, task_id="t")


@pytest.mark.parametrize("final,truth,expected", [
    ("I think <answer> Paris </answer>", "paris", 1.0),
    ("<answer>Lyon</answer> then <answer>Paris</answer>", "Paris", 1.0),  # the last tag counts
    ("Paris", "Paris", 1.0),  # no tag: the whole final text
    ("<answer>New   York</answer>", "new york", 1.0),
    ("<answer>Parisian</answer>", "Paris", 0.0),
    ("<answer>b</answer>", ["a", "B"], 1.0),
])
async def test_exact_match(final, truth, expected):
    reward = await compute_reward(task(type="exact_match", ground_truth=truth), episode(final), RewardConfig())
    assert reward == expected


async def test_exact_match_case_sensitive_and_answer_modes():
    t = task(type="exact_match", ground_truth="Paris", case_sensitive=True)
    assert await compute_reward(t, episode("<answer>paris</answer>"), RewardConfig()) == 0.0
    strict = RewardConfig(answer_from="answer_tag_strict")
    assert await compute_reward(task(type="exact_match", ground_truth="Paris"), episode("Paris"), strict) == 0.0
    final = RewardConfig(answer_from="final_text")
    assert await compute_reward(task(type="exact_match", ground_truth="Paris"),
                                episode("<answer>Paris</answer>"), final) == 0.0


@pytest.mark.parametrize("final,truth,tol,expected", [
    ("<answer>42</answer>", "42", 1e-6, 1.0),
    ("<answer>The total is 1,234.5 dollars</answer>", "1234.5", 1e-6, 1.0),
    ("<answer>3/4</answer>", "0.75", 1e-6, 1.0),
    ("<answer>-2.5e1</answer>", "-25", 1e-6, 1.0),
    ("<answer>0.333</answer>", "1/3", 1e-2, 1.0),
    ("<answer>0.333</answer>", "1/3", 1e-6, 0.0),
    ("<answer>no number</answer>", "1", 1e-6, 0.0),
])
async def test_numeric(final, truth, tol, expected):
    assert await compute_reward(task(type="numeric", ground_truth=truth, tolerance=tol), episode(final),
                                RewardConfig()) == expected


def test_parse_number_and_extractors():
    assert parse_number("x = $12, y = 7") == 7.0 and parse_number("none") is None
    assert extract_answer("a <answer>1</answer>", "answer_tag_strict") == "1"
    assert extract_answer("a", "answer_tag_strict") is None
    assert extract_code("```python\ndef f():\n    return 1\n```\ntext ```python\nx = 2\n```", "answer_tag") == "x = 2\n"


async def test_custom_and_module_rewards_sync_and_async():
    cfg = RewardConfig(custom={"len": "tests_reward_fns:length_reward"})
    assert await compute_reward(task(type="len"), episode("x"), cfg) == 4.0
    assert await compute_reward(task(type="tests_reward_fns:async_reward"), episode("x"), cfg) == 0.5
    with pytest.raises(RuntimeError, match="grader crashed"):
        await compute_reward(task(type="tests_reward_fns:raising_reward"), episode("x"), cfg)


def test_bad_specs_fail_before_rollout():
    cfg = RewardConfig()
    with pytest.raises(RewardSpecError, match="unknown reward type 'answer_match'"):
        check_reward_specs([task(type="answer_match", ground_truth="1")], cfg)
    with pytest.raises(RewardSpecError, match="needs field"):
        check_reward_specs([task(type="numeric")], cfg)
    with pytest.raises(ConfigError, match="has no attribute"):
        check_reward_specs([task(type="tests_reward_fns:nothing_here")], cfg)


async def test_unit_tests_without_sandbox_url_is_a_clear_error():
    t = task(type="unit_tests", tests="assert f(1) == 2", entry_point="f")
    with pytest.raises(RewardSpecError, match="sandbox_url"):
        await compute_reward(t, episode("```python\ndef f(x):\n    return x + 1\n```"), RewardConfig())


async def test_unit_tests_missing_entry_point_scores_zero_without_sandbox():
    t = task(type="unit_tests", tests="assert f(1) == 2", entry_point="f")
    cfg = RewardConfig(sandbox_url="http://127.0.0.1:9")  # never contacted
    assert await compute_reward(t, episode("```python\ndef g(x):\n    return x\n```"), cfg) == 0.0


@pytest.mark.parametrize("finish", ["length", "max_turns", "timeout"])
async def test_an_unfinished_episode_has_no_answer(finish):
    """A right answer followed by tokens that never ended the turn (cut at a limit) scores 0 with every built-in
    reward: credited, it would teach RL to keep writing past the answer. score_unfinished scores it as it stands."""
    answered = "<answer>42</answer>\": \"calculator\", \"arguments\": {\"expression\": \"42"
    cut = episode(answered)
    cut.finish_reason = finish
    finished = episode("<answer>42</answer>")
    for spec in ({"type": "exact_match", "ground_truth": "42"}, {"type": "numeric", "ground_truth": 42}):
        assert await compute_reward(task(**spec), finished, RewardConfig()) == 1.0
        assert await compute_reward(task(**spec), cut, RewardConfig()) == 0.0
        assert await compute_reward(task(**spec), cut, RewardConfig(score_unfinished=True)) == 1.0


async def test_an_unfinished_code_answer_is_not_run():
    """Code rewards: an episode cut at a limit never reaches the sandbox (the URL below is never contacted) and
    records why it scored 0."""
    t = task(type="unit_tests", tests="assert f(1) == 2", entry_point="f")
    cut = episode("```python\ndef f(x):\n    return x + 1\n```\nand then some")
    cut.finish_reason = "length"
    assert await compute_reward(t, cut, RewardConfig(sandbox_url="http://127.0.0.1:9")) == 0.0
    assert cut.metrics["reward_info"]["kind"] == "no_code"
    assert "did not finish" in cut.metrics["reward_info"]["error"]
    s = task(type="stdin_stdout", cases=[{"input": "1", "output": "2"}])
    assert await compute_reward(s, cut, RewardConfig(sandbox_url="http://127.0.0.1:9")) == 0.0


async def test_identical_programs_take_one_verdict(monkeypatch):
    """The samples of a group that write the same code are graded by one sandbox run, in flight or done; another
    program, other tests or `reuse_verdicts: false` run again."""
    import asyncio

    from agentrl.agent_loop import code_tests, rewards

    runs = []

    async def fake_run(url, code, tests, *, timeout_s):
        runs.append(code)
        await asyncio.sleep(0.01)
        return code_tests.TestReport(1, 1, "passed") if "+ 1" in code else code_tests.TestReport(0, 1, "assertion")

    monkeypatch.setattr(code_tests, "run_unit_tests", fake_run)
    monkeypatch.setattr(rewards, "VERDICTS", rewards.VerdictCache())
    cfg = RewardConfig(sandbox_url="http://127.0.0.1:9")
    t = task(type="unit_tests", tests="assert f(1) == 2", entry_point="f")
    right, wrong = "```python\ndef f(x):\n    return x + 1\n```", "```python\ndef f(x):\n    return x\n```"
    group = [episode(right) for _ in range(6)] + [episode(wrong) for _ in range(2)]
    rewards_ = await asyncio.gather(*[compute_reward(t, e, cfg) for e in group])
    assert rewards_ == [1.0] * 6 + [0.0] * 2
    assert len(runs) == 2, "one run per distinct program"
    assert sum(bool(e.metrics["reward_info"].get("reused")) for e in group) == 6
    assert await compute_reward(t, episode(right), cfg) == 1.0 and len(runs) == 2  # kept after the step
    other = task(type="unit_tests", tests="assert f(2) == 3", entry_point="f")
    assert await compute_reward(other, episode(right), cfg) == 1.0 and len(runs) == 3
    off = RewardConfig(sandbox_url="http://127.0.0.1:9", reuse_verdicts=False)
    assert await compute_reward(t, episode(right), off) == 1.0 and len(runs) == 4


async def test_a_verdict_cache_keeps_no_failed_or_load_dependent_run():
    """A run that raised (sandbox fault) or whose verdict depends on load (timeout) is not reused: the copies
    waiting on it run their own, and a later copy runs again."""
    import asyncio

    from agentrl.agent_loop.code_tests import TestReport
    from agentrl.agent_loop.rewards import VerdictCache

    cache, calls = VerdictCache(size=2), []

    def runner(result):
        async def run_once():
            calls.append(result)
            await asyncio.sleep(0.01)
            if isinstance(result, Exception):
                raise result
            return result
        return run_once

    first = asyncio.ensure_future(cache.run("k", runner(RuntimeError("sandbox down"))))
    await asyncio.sleep(0)
    second = await cache.run("k", runner(TestReport(1, 1, "passed")))
    with pytest.raises(RuntimeError):
        await first
    assert second == (TestReport(1, 1, "passed"), False) and len(calls) == 2
    assert await cache.run("k", runner(None)) == (TestReport(1, 1, "passed"), True)

    assert (await cache.run("slow", runner(TestReport(0, 1, "timeout"))))[1] is False
    assert (await cache.run("slow", runner(TestReport(1, 1, "passed"))))[1] is False, "a timeout is not kept"
    for key in ("a", "b"):  # size 2: the least recently used ("k") goes
        await cache.run(key, runner(TestReport(0, 1, "assertion")))
    assert (await cache.run("k", runner(TestReport(1, 1, "passed"))))[1] is False
