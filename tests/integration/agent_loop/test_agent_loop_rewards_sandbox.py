"""`unit_tests` rewards against the real sandbox service; a sandbox that is down makes the episode infra_error."""

from __future__ import annotations

import pytest
from helpers import free_port, sandbox_service

from agentrl.agent_loop import AgentLoopConfig, RewardConfig, RolloutConfig, RolloutManager
from agentrl.agent_loop.rewards import compute_reward
from agentrl.types import Episode, Generation, Task

pytestmark = pytest.mark.slow

TESTS = "assert add_one(1) == 2\nassert add_one(-1) == 0"


def _episode(final: str) -> Episode:
    return Episode(uid="u", prompt_ids=[], response_ids=[], response_mask=[], response_logprobs=[],
                   messages=[{"role": "user", "content": "write add_one"}, {"role": "assistant", "content": final}])


def _task() -> Task:
    return Task(prompt=[{"role": "user", "content": "Write add_one(x)."}], task_id="code-1",
                reward={"type": "unit_tests", "tests": TESTS, "entry_point": "add_one"})


@pytest.fixture(scope="module")
def sandbox_url():
    with sandbox_service("max_concurrency=2") as url:
        yield url


async def test_unit_tests_reward_runs_in_the_sandbox(sandbox_url):
    cfg = RewardConfig(sandbox_url=sandbox_url, unit_tests_timeout_s=5.0)
    good = "Here:\n```python\ndef add_one(x):\n    return x + 1\n```"
    wrong = "```python\ndef add_one(x):\n    return x + 2\n```"
    hangs = "```python\ndef add_one(x):\n    while True:\n        pass\n```"
    tagged = "<answer>def add_one(x):\n    return x + 1</answer>"
    assert await compute_reward(_task(), _episode(good), cfg) == 1.0
    assert await compute_reward(_task(), _episode(wrong), cfg) == 0.0
    assert await compute_reward(_task(), _episode(hangs), RewardConfig(sandbox_url=sandbox_url,
                                                                      unit_tests_timeout_s=1.0)) == 0.0
    assert await compute_reward(_task(), _episode(tagged), cfg) == 1.0


class OneAnswer:
    """An engine whose every turn is the same final answer."""

    def __init__(self, tokenizer, text: str):
        self.ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.convert_tokens_to_ids("<|im_end|>")]

    async def generate(self, input_ids, params):
        return Generation(token_ids=self.ids, logprobs=[-0.1] * len(self.ids), finish_reason="stop")


async def test_sandbox_down_makes_the_episode_infra_error(qwen2_tokenizer_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(qwen2_tokenizer_dir)
    engine = OneAnswer(tokenizer, "```python\ndef add_one(x):\n    return x + 1\n```")
    dead = f"http://127.0.0.1:{free_port()}"
    manager = RolloutManager(engine, tokenizer, None, AgentLoopConfig(), RolloutConfig(n=1),
                             RewardConfig(sandbox_url=dead))
    (episode,) = await manager.generate([_task()])
    assert episode.infra_error and episode.reward == 0.0
    assert "SandboxInfraError" in episode.metrics["reward_error"]
