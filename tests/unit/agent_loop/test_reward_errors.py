"""Whose fault a failed reward is: the reward code's own exception stops the run with one line naming the reward,
the task and the line that raised (reward.on_error: raise), or scores 0 (zero / drop); the sandbox failing under
a code reward stays an infrastructure fault."""

from __future__ import annotations

import pytest

from agentrl.agent_loop.config import RewardConfig
from agentrl.agent_loop.rewards import RewardError, score_episode
from agentrl.config import ConfigError, load_config
from agentrl.services import free_port
from agentrl.trainer.config import TrainConfig
from agentrl.types import Episode, Task


def episode(final: str) -> Episode:
    return Episode(uid="u", prompt_ids=[], response_ids=[], response_mask=[], response_logprobs=[],
                   messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": final}])


def task(task_id: str = "calc-3", **reward) -> Task:
    return Task(prompt=[{"role": "user", "content": "q"}], reward=reward, task_id=task_id)


async def test_raise_names_the_reward_the_task_and_the_line():
    with pytest.raises(RewardError) as raised:
        await score_episode(task(type="tests_reward_fns:raising_reward"), episode("x"), RewardConfig())
    assert str(raised.value) == (
        "reward 'tests_reward_fns:raising_reward' raised RuntimeError: grader crashed (tests_reward_fns.py:18) on "
        "task 'calc-3'; fix the reward function (AGENTRL_DEBUG=1 shows the traceback), or set reward.on_error=zero "
        "(score such episodes 0) or reward.on_error=drop (leave their groups out)")
    raised.value.origin, raised.value.log_file = "data/train.jsonl:row 4", "runs/x/train.log"
    assert "on task 'calc-3' (data/train.jsonl:row 4); fix the reward function (traceback in runs/x/train.log)" \
        in str(raised.value)


async def test_a_custom_name_is_shown_with_its_function_and_spec_errors_count_too():
    cfg = RewardConfig(custom={"crash": "tests_reward_fns:raising_reward"})
    with pytest.raises(RewardError, match=r"^reward 'crash' \(tests_reward_fns:raising_reward\) raised"):
        await score_episode(task(type="crash"), episode("x"), cfg)
    # a built-in reward's own failure (a bad ground truth) is a reward error as well, not an infra fault
    with pytest.raises(RewardError, match="reward 'numeric' raised RewardSpecError: task 'calc-3': numeric "
                                          "ground_truth 'abc' is not a number"):
        await score_episode(task(type="numeric", ground_truth="abc"), episode("<answer>3</answer>"), RewardConfig())


@pytest.mark.parametrize("mode", ["zero", "drop"])
async def test_zero_and_drop_score_zero_and_keep_the_error(mode):
    ep = episode("x")
    await score_episode(task(type="tests_reward_fns:raising_reward"), ep, RewardConfig(on_error=mode))
    assert ep.reward == 0.0 and not ep.infra_error
    assert ep.metrics["reward_error"] == "RuntimeError: grader crashed (tests_reward_fns.py:18)"


async def test_a_dead_sandbox_is_an_infra_fault_whatever_on_error_says():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there: connection refused
    ep = episode("```python\ndef f(x):\n    return x + 1\n```")
    await score_episode(task(type="unit_tests", tests="assert f(1) == 2"), ep, RewardConfig(sandbox_url=url))
    assert ep.infra_error and ep.reward == 0.0
    assert ep.metrics["infra_detail"].startswith(f"sandbox (unreachable): sandbox {url} unreachable")


def test_on_error_is_checked_at_config_load():
    assert load_config(TrainConfig, None, ["reward.on_error=drop"]).reward.on_error == "drop"
    with pytest.raises(ConfigError) as raised:
        load_config(TrainConfig, None, ["reward.on_error=ignore"])
    message = str(raised.value)
    assert message.startswith("reward.on_error: 'ignore' is not one of 'raise', 'zero', 'drop'") and "\n" not in message
