"""End to end: the tiny model through LocalEngine, a real HTTP tool service, RolloutManager, episodes.jsonl.

The tiny model is first taught (a few seconds of fine-tuning) to call the service's `wait` tool, so episodes
really sample tool calls token by token. Checked: the rollout logprobs of every sampled token equal a fresh
forward pass over prompt + response (what the trainer recomputes), the ids equal the chat template's rendering
of the transcript, observations have mask 0, and a tool service that dies mid-run gives infra_error episodes.
"""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
from helpers import free_port, service

from agentrl.agent_loop import AgentLoopConfig, RewardConfig, RolloutConfig, RolloutManager
from agentrl.agent_loop.bench import WAIT_ENV, teach_tool_calls, wait
from agentrl.agent_loop.chat import canonical_tools
from agentrl.agent_loop.rollout import read_episodes
from agentrl.tools import ToolRegistry
from agentrl.types import Task

pytestmark = pytest.mark.slow

QUESTION = "Check the service."


@pytest.fixture(scope="module")
def taught_model(tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    schemas = ToolRegistry.from_functions([wait]).schemas()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a shared 2-core machine: OpenMP spin-waits make more threads slower
    try:
        loss = teach_tool_calls(model, tokenizer, schemas, questions=[QUESTION], turns=3, steps=100,
                                turn_text="Checking.")
    finally:
        torch.set_num_threads(threads)
    assert loss < 0.5, f"the tiny model did not learn the tool call (loss {loss:.3f})"
    return model, tokenizer


@pytest.fixture(scope="module")
def wait_service():
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with service(["python", "-m", "agentrl.cli", "tools", "serve", "agentrl.agent_loop.bench:wait", "--port",
                  str(port)], f"{url}/health", env={WAIT_ENV: "20"}) as proc:
        yield url, proc


def _registry(url: str) -> ToolRegistry:
    return ToolRegistry.from_config({"services": [{"url": url, "retries": 0, "timeout_s": 5.0,
                                                   "connect_timeout_s": 1.0}]})


def _tasks(k: int) -> list[Task]:
    return [Task(prompt=[{"role": "user", "content": QUESTION}], task_id=f"e2e{i}",
                 reward={"type": "exact_match", "ground_truth": "ok"}) for i in range(k)]


def _recomputed_logprobs(model, ids: list[int]) -> list[float]:
    import torch

    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    logprobs = torch.log_softmax(logits[:-1], dim=-1)
    return logprobs.gather(1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()


async def test_rollout_through_local_engine_and_http_tools(taught_model, wait_service, tmp_path):
    from agentrl.inference.config import EngineConfig
    from agentrl.inference.local import LocalEngine

    model, tokenizer = taught_model
    url, _ = wait_service
    engine = LocalEngine(model, tokenizer, EngineConfig(max_batch_size=8, num_threads=1))
    registry = _registry(url)
    try:
        greedy = RolloutManager(engine, tokenizer, registry, AgentLoopConfig(max_assistant_turns=3,
                                                                             max_new_tokens_per_turn=32),
                                RolloutConfig(n=2, temperature=0.0), RewardConfig(), run_dir=tmp_path)
        episodes = await greedy.generate(_tasks(2))
        sampled = RolloutManager(engine, tokenizer, registry, AgentLoopConfig(max_assistant_turns=3,
                                                                              max_new_tokens_per_turn=32),
                                 RolloutConfig(n=2, temperature=1.0, seed=7), RewardConfig(), run_dir=tmp_path)
        episodes += await sampled.generate(_tasks(1), step=1)
    finally:
        await registry.aclose()
        await engine.close()

    schemas = ToolRegistry.from_functions([wait]).schemas()
    calls = 0
    for episode in episodes:
        episode.check()
        assert not episode.infra_error, episode.metrics
        full = episode.prompt_ids + episode.response_ids
        # every sampled token's rollout logprob is what the trainer will recompute (temperature 1 and greedy)
        recomputed = _recomputed_logprobs(model, full)
        p = len(episode.prompt_ids)
        for i, (m, lp) in enumerate(zip(episode.response_mask, episode.response_logprobs)):
            if m:
                assert lp == pytest.approx(recomputed[p + i - 1], abs=2e-4), f"token {i} of {episode.uid}"
            else:
                assert lp == 0.0
        calls += sum(c["ok"] for c in episode.tool_calls)
        # The transcript renders back to the episode's ids whatever call text was sampled (a call in another form
        # than the template's stays verbatim in the content); only ids that are not the tokenizer's encoding of
        # their own text cannot be reproduced, and the episode counts those turns.
        if episode.finish_reason == "max_turns" and not episode.metrics.get("noncanonical_token_turns"):
            text = tokenizer.apply_chat_template(episode.messages, tools=canonical_tools(schemas), tokenize=False)
            rendered = tokenizer.encode(text, add_special_tokens=False)
            assert rendered[:len(full)] == full and tokenizer.decode(rendered[len(full):]) == "\n"
    greedy_eps = episodes[:4]
    assert all(e.finish_reason == "max_turns" and len(e.tool_calls) == 2 for e in greedy_eps)
    assert calls >= 8  # 2 per greedy episode
    rows = read_episodes(tmp_path / "episodes.jsonl")
    assert [r["step"] for r in rows] == [0] * 4 + [1] * 2
    assert rows[0]["tool_calls"][0]["name"] == "wait" and rows[0]["tool_calls"][0]["ok"] is True


async def test_tool_service_dying_mid_run_is_infra_error(taught_model, tiny_model_dir):
    from agentrl.inference.config import EngineConfig
    from agentrl.inference.local import LocalEngine

    model, tokenizer = taught_model
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    registry = _registry(url)
    with service(["python", "-m", "agentrl.cli", "tools", "serve", "agentrl.agent_loop.bench:wait", "--port",
                  str(port)], f"{url}/health", env={WAIT_ENV: "0"}) as proc:
        await registry.start()  # discovers the tool while the service is up
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    engine = LocalEngine(model, tokenizer, EngineConfig(max_batch_size=4, num_threads=1))
    manager = RolloutManager(engine, tokenizer, registry, AgentLoopConfig(max_assistant_turns=3),
                             RolloutConfig(n=2, temperature=0.0), RewardConfig())
    try:
        episodes = await asyncio.wait_for(manager.generate(_tasks(1)), timeout=60)
    finally:
        await registry.aclose()
        await engine.close()
    for episode in episodes:
        assert (episode.finish_reason, episode.infra_error) == ("infra_error", True)
        assert episode.tool_calls[0]["error_kind"] == "unreachable" and episode.reward == 0.0
