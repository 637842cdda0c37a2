"""A verifiers environment (verifiers' own Env, taskset and rubric, built in code) through the policy front on
the tiny model: the episode is the tokens the engine sampled and the reward is the one verifiers' rubric gave."""

from __future__ import annotations

import pytest

from agentrl.agent_loop.agent_program import AgentProgramLoop
from agentrl.agent_loop.config import AgentLoopConfig
from agentrl.types import SamplingParams, Task

pytestmark = pytest.mark.slow
pytest.importorskip("verifiers.v1", reason="pip install -e '.[agents]'")


class SpyEngine:
    def __init__(self, engine):
        self.engine, self.returned = engine, []

    async def generate(self, input_ids, params, *, session_id=None):
        gen = await self.engine.generate(input_ids, params, session_id=session_id)
        self.returned.append((list(input_ids), gen))
        return gen


async def test_a_verifiers_episode_is_recorded_and_scored_by_its_rubric(tiny_model_dir):
    from transformers import AutoTokenizer
    from vf_tiny_taskset import length_score

    from agentrl.envs.verifiers_env import verifiers_agent
    from agentrl.inference.local import LocalEngine

    engine = LocalEngine.from_pretrained(str(tiny_model_dir))
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    spy = SpyEngine(engine)
    loop = AgentProgramLoop(spy, tokenizer, verifiers_agent, AgentLoopConfig(max_new_tokens_per_turn=12))
    task = Task(prompt=[], task_id="vf-1", extra={"verifiers": {"taskset": "vf_tiny_taskset", "idx": 1}})
    try:
        (ep,) = await loop.run(task, sampling=SamplingParams(max_new_tokens=1, temperature=1.0, seed=5), uid="g",
                               session_id="g-0")
    finally:
        await loop.aclose()
        await engine.close()
    assert not ep.infra_error, ep.metrics.get("infra_detail")
    assert len(spy.returned) == 1 and ep.metrics["reward_from"] == "program"
    sent, gen = spy.returned[0]
    assert ep.prompt_ids == sent and ep.response_ids == gen.token_ids and all(ep.response_mask)
    assert ep.response_logprobs == gen.logprobs
    assert tokenizer.decode(sent).startswith("<|im_start|>system\nAnswer briefly.<|im_end|>\n<|im_start|>user\n"
                                             "Name a colour.")
    # verifiers' rubric scored the answer the front returned: the sampled text less the end-of-turn token.
    answer = ep.messages[-1]["content"]
    assert tokenizer.decode(gen.token_ids).startswith(answer)
    assert ep.reward == length_score(answer)


async def test_a_task_without_a_verifiers_column_is_an_infra_failure(tiny_model_dir):
    from transformers import AutoTokenizer

    from agentrl.envs.verifiers_env import verifiers_agent

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    loop = AgentProgramLoop(SpyEngine(None), tokenizer, verifiers_agent, AgentLoopConfig())  # never called
    try:
        (ep,) = await loop.run(Task(prompt=[], task_id="x"), sampling=SamplingParams(max_new_tokens=4), uid="g",
                               session_id="g-1")
    finally:
        await loop.aclose()
    assert ep.infra_error and "extra.verifiers: {taskset" in ep.metrics["infra_detail"]


async def test_a_rubric_that_raises_is_an_infra_failure(tiny_model_dir):
    from transformers import AutoTokenizer

    from agentrl.envs.verifiers_env import verifiers_agent
    from agentrl.inference.local import LocalEngine

    engine = LocalEngine.from_pretrained(str(tiny_model_dir))
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    loop = AgentProgramLoop(engine, tokenizer, verifiers_agent, AgentLoopConfig(max_new_tokens_per_turn=4))
    task = Task(prompt=[], task_id="vf-2", extra={"verifiers": {"taskset": "vf_tiny_taskset", "idx": 2}})
    try:
        episodes = await loop.run(task, sampling=SamplingParams(max_new_tokens=1, seed=5), uid="g", session_id="g-2")
    finally:
        await loop.aclose()
        await engine.close()
    assert all(ep.infra_error for ep in episodes)  # dropped, never trained as reward 0
    assert "verifiers episode failed" in episodes[0].metrics["infra_detail"]
    assert "the rubric broke" in episodes[0].metrics["infra_detail"]
