"""The policy front on the tiny model: what it records is what the engine sampled (ids, logprobs under the
model's own forward pass), with an OpenAI Agents SDK agent as the client; and `agentrl serve-policy` serves the
OpenAI API from a subprocess, and so does `agentrl engine serve` beside SGLang's API."""

from __future__ import annotations

import sys

import httpx
import pytest
import torch
from agent_programs import agents_sdk_agent
from helpers import free_port, service

from agentrl.agent_loop.calls import episodes_from_calls
from agentrl.agent_loop.openai_front import PolicyFront
from agentrl.agent_loop.openai_server import create_app, serve_in_loop
from agentrl.types import SamplingParams, Task

pytestmark = pytest.mark.slow
openai = pytest.importorskip("openai", reason="pip install -e '.[agents]'")
pytest.importorskip("agents", reason="pip install -e '.[agents]'")

TASK = Task(prompt=[{"role": "user", "content": "What is 1 + 2?"}])


class SpyEngine:
    """The engine, with every Generation it returned kept."""

    def __init__(self, engine):
        self.engine, self.returned = engine, []

    async def generate(self, input_ids, params, *, session_id=None):
        gen = await self.engine.generate(input_ids, params, session_id=session_id)
        self.returned.append((list(input_ids), gen))
        return gen


async def test_recorded_tokens_are_what_the_engine_sampled(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentrl.inference.local import LocalEngine
    from agentrl.trainer.algos import logprobs_from_logits

    engine = LocalEngine.from_pretrained(str(tiny_model_dir))
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    spy = SpyEngine(engine)
    front = PolicyFront(spy, tokenizer, max_new_tokens=24, max_model_len=engine.max_model_len)
    front.open_episode("ep", SamplingParams(max_new_tokens=1, temperature=1.0, seed=7))
    try:
        async with serve_in_loop(create_app(front)) as url:
            reward = await agents_sdk_agent(TASK, f"{url}/episodes/ep/v1", "ep")
    finally:
        await engine.close()
    assert reward in (0.0, 1.0)
    calls, error = front.take("ep")
    assert error is None and len(calls) == len(spy.returned) >= 1
    for call, (sent, gen) in zip(calls, spy.returned):
        assert call.prompt_ids == sent and call.completion_ids == gen.token_ids
        assert call.logprobs == gen.logprobs and call.weight_versions == [0] * len(gen.token_ids)
    # The prompt is the chat template's rendering of the SDK's messages (system instructions, user input).
    assert tokenizer.decode(calls[0].prompt_ids).startswith("<|im_start|>system\nUse the add tool, then answer.")
    (ep, *_) = episodes_from_calls(calls, uid="g", episode_id="ep", messages=[])
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([ep.prompt_ids + ep.response_ids])
    with torch.no_grad():
        logits = model(ids).logits[:, :-1]
    trainer = logprobs_from_logits(logits, ids[:, 1:])[0, len(ep.prompt_ids) - 1:]
    mask = torch.tensor(ep.response_mask, dtype=torch.bool)
    assert torch.allclose(trainer[mask], torch.tensor(ep.response_logprobs)[mask], atol=1e-4)


@pytest.mark.parametrize("command", ["serve-policy", "engine serve"])
def test_served_openai_api(tiny_model_dir, command):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = [sys.executable, "-m", "agentrl.cli", *command.split(), "--model", str(tiny_model_dir), "--port", str(port)]
    if command == "serve-policy":
        args += ["--max-new-tokens", "8", "--model-name", "tiny"]
    with service(args, f"{url}/health", timeout=120):
        client = openai.OpenAI(base_url=f"{url}/episodes/run-1/v1", api_key="unused")
        name = "tiny" if command == "serve-policy" else str(tiny_model_dir)
        assert [m.id for m in client.models.list().data] == [name]
        reply = client.chat.completions.create(model=name, messages=TASK.prompt, max_tokens=4, temperature=0,
                                               logprobs=True)
        choice = reply.choices[0]
        assert choice.finish_reason in ("stop", "length") and reply.usage.completion_tokens <= 4
        assert len(choice.logprobs.content) == reply.usage.completion_tokens
        record = httpx.get(f"{url}/v1/episodes/run-1").json()
        (call,) = record["calls"]
        assert len(call["prompt_ids"]) == reply.usage.prompt_tokens
        assert call["logprobs"] == pytest.approx([t.logprob for t in choice.logprobs.content])
        assert httpx.delete(f"{url}/v1/episodes/run-1").json()["calls"] == 1
        assert httpx.get(f"{url}/v1/episodes/run-1").json()["calls"] == []


def test_serve_policy_over_sglang_api_servers(tiny_model_dir):
    """`--engine-url`: the front samples through the SGLang client (here from `agentrl engine serve`); the weight
    version the server reports is recorded on every sampled token."""
    engine_port, port = free_port(), free_port()
    engine_url, url = f"http://127.0.0.1:{engine_port}", f"http://127.0.0.1:{port}"
    engine = [sys.executable, "-m", "agentrl.cli", "engine", "serve", "--model", str(tiny_model_dir), "--port",
              str(engine_port)]
    front = [sys.executable, "-m", "agentrl.cli", "serve-policy", "--model", str(tiny_model_dir), "--port", str(port),
             "--engine-url", engine_url]
    with service(engine, f"{engine_url}/health", timeout=120), service(front, f"{url}/health", timeout=120):
        client = openai.OpenAI(base_url=f"{url}/episodes/e/v1", api_key="unused")
        reply = client.chat.completions.create(model="agentrl-policy", messages=TASK.prompt, max_tokens=4,
                                               logprobs=True)
        (call,) = httpx.get(f"{url}/v1/episodes/e").json()["calls"]
        assert len(call["completion_ids"]) == reply.usage.completion_tokens
        assert call["logprobs"] == pytest.approx([t.logprob for t in reply.choices[0].logprobs.content])
        assert call["weight_versions"] == [0] * len(call["completion_ids"])
