"""`agentrl engine serve` (LocalEngine behind SGLang's HTTP API) + SGLangEngine, end to end on loopback."""

from __future__ import annotations

import asyncio
import sys

import httpx
import pytest
import torch
from helpers import free_port, service

from agentrl.inference import EngineConfig, PromptTooLongError
from agentrl.inference.sglang import SGLangEngine
from agentrl.trainer.algos import logprobs_from_logits
from agentrl.types import SamplingParams

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = [sys.executable, "-m", "agentrl.cli", "engine", "serve", "--model", str(tiny_model_dir), "--port",
            str(port), "--max-batch-size", "8", "--max-model-len", "256", "--num-threads", "1"]
    with service(args, f"{url}/health", timeout=120):
        yield url


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def _client(url: str) -> SGLangEngine:
    return SGLangEngine([url], EngineConfig(backend="sglang", urls=[url], health_timeout_s=30))


def _recompute(model, prompt, out, temperature):
    with torch.no_grad():
        logits = model(torch.tensor([prompt + out])).logits[0, len(prompt) - 1:-1]
    return logprobs_from_logits(logits, torch.tensor(out), temperature=temperature)


async def test_client_round_trip_matches_model(server, model):
    eng = _client(server)
    prompts = [[11, 12, 13, 14, 15], list(range(100, 160)), [7] * 30]
    gens = await asyncio.gather(*[eng.generate(p, SamplingParams(max_new_tokens=12, temperature=t, seed=3),
                                               session_id=f"ep{i}")
                                  for i, (p, t) in enumerate(zip(prompts, [0.0, 0.8, 1.0]))])
    for p, g, t in zip(prompts, gens, [1.0, 0.8, 1.0]):
        assert len(g.token_ids) == len(g.logprobs) == 12 and g.finish_reason == "length"
        diff = (torch.tensor(g.logprobs) - _recompute(model, p, g.token_ids, t)).abs().max().item()
        assert diff < 1e-4
    with torch.no_grad():
        greedy = model.generate(torch.tensor([prompts[0]]), max_new_tokens=12, do_sample=False,
                                eos_token_id=None, pad_token_id=0)[0, 5:].tolist()
    assert gens[0].token_ids == greedy
    stop = gens[0].token_ids[4]
    stopped = await eng.generate(prompts[0], SamplingParams(max_new_tokens=12, temperature=0, stop_token_ids=[stop]))
    assert stopped.finish_reason == "stop" and stopped.token_ids[-1] == stop
    assert stopped.metrics["finish_detail"] == {"type": "stop", "matched": stop}
    with pytest.raises(PromptTooLongError):
        await eng.generate([5] * 300, SamplingParams(max_new_tokens=4))
    await eng.close()


async def test_batch_request_and_error_shapes(server):
    async with httpx.AsyncClient(base_url=server, timeout=60) as http:
        r = await http.post("/generate", json={
            "input_ids": [[1, 2, 3], [4, 5, 6, 7, 8]],
            "sampling_params": [{"max_new_tokens": 3, "temperature": 0}, {"max_new_tokens": 5, "temperature": 0}],
            "return_logprob": True, "return_text_in_logprobs": True})
        assert r.status_code == 200
        items = r.json()
        assert [len(it["output_ids"]) for it in items] == [3, 5]
        for it in items:
            meta = it["meta_info"]
            assert meta["finish_reason"] == {"type": "length", "length": len(it["output_ids"])}
            assert [e[1] for e in meta["output_token_logprobs"]] == it["output_ids"]
            assert all(isinstance(e[0], float) and isinstance(e[2], str) for e in meta["output_token_logprobs"])
            assert meta["prompt_tokens"] in (3, 5) and isinstance(it["text"], str)
        # text input, single item -> single object
        r = await http.post("/generate", json={"text": "hello", "sampling_params": {"max_new_tokens": 2,
                                                                                  "ignore_eos": True}})
        assert r.status_code == 200 and len(r.json()["output_ids"]) == 2
        bad = [
            ({"input_ids": []}, "input_ids"),
            ({"input_ids": [1, 2], "sampling_params": {"min_p": 0.1}}, "min_p"),
            ({"input_ids": [1, 2], "sampling_params": {"bogus": 1}}, "bogus"),
            ({"input_ids": [1, 2], "stream": True}, "stream"),
            ({"input_ids": [1, 2], "sampling_params": {"temperature": -1}}, "temperature"),
            ({"input_ids": [[1], [2]], "sampling_params": [{}]}, "batch"),
            ({"input_ids": [1, 10**8]}, "vocabulary"),
            ({"input_ids": [5] * 300}, "max_model_len"),
        ]
        for body, word in bad:
            r = await http.post("/generate", json=body)
            assert r.status_code == 400, body
            assert word in r.json()["error"]["message"], (body, r.json())
        r = await http.post("/generate", content=b"{not json")
        assert r.status_code == 400
        info = (await http.get("/get_model_info")).json()
        assert info["is_generation"] is True and info["max_model_len"] == 256
        assert (await http.get("/health_generate")).status_code == 200
        assert (await http.post("/flush_cache")).status_code == 200
        r = await http.post("/release_memory_occupation", json={})
        assert r.status_code == 400 and "not supported" in r.json()["error"]["message"]


async def test_ignore_eos_and_min_new_tokens_are_honoured(server):
    eng = _client(server)
    prompt = [21, 22, 23, 24, 25, 26]
    free = await eng.generate(prompt, SamplingParams(max_new_tokens=12, temperature=0))
    stop = free.token_ids[0]
    stopped = await eng.generate(prompt, SamplingParams(max_new_tokens=12, temperature=0, stop_token_ids=[stop]))
    assert stopped.finish_reason == "stop" and stopped.token_ids == [stop]
    # the client forwards both fields; the server runs past the stop token / masks it (as SGLang)
    ignored = await eng.generate(prompt, SamplingParams(max_new_tokens=12, temperature=0, stop_token_ids=[stop],
                                                        ignore_eos=True))
    assert ignored.finish_reason == "length" and ignored.token_ids == free.token_ids
    at_least = await eng.generate(prompt, SamplingParams(max_new_tokens=12, temperature=0, stop_token_ids=[stop],
                                                         min_new_tokens=5))
    assert len(at_least.token_ids) >= 5 and stop not in at_least.token_ids[:5]
    await eng.close()
    async with httpx.AsyncClient(base_url=server, timeout=60) as http:
        # max_new_tokens null: until the context (max_model_len 256) is full, as SGLang
        r = await http.post("/generate", json={"input_ids": [7] * 250, "sampling_params": {
            "max_new_tokens": None, "temperature": 0, "ignore_eos": True, "min_p": 0.0, "n": 1, "stop_regex": None}})
        assert r.status_code == 200 and len(r.json()["output_ids"]) == 6
        for sampling_params, field in [({"min_new_tokens": 8, "max_new_tokens": 4}, "min_new_tokens"),
                                       ({"ignore_eos": "yes"}, "ignore_eos"),
                                       ({"stop_regex": "\\d+"}, "stop_regex"),
                                       ({"logit_bias": {"5": 2.0}}, "logit_bias"),
                                       ({"n": 2}, "n"),
                                       ({"no_such_param": 1}, "no_such_param")]:
            r = await http.post("/generate", json={"input_ids": [1, 2], "sampling_params": sampling_params})
            assert r.status_code == 400 and field in r.json()["error"]["message"], (sampling_params, r.text)


async def test_update_weights_from_disk_changes_outputs(server, model, tmp_path):
    eng = _client(server)
    prompt = list(range(20, 40))
    sp = SamplingParams(max_new_tokens=10, temperature=0)
    before = await eng.generate(prompt, sp)
    import copy

    new = copy.deepcopy(model)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    new.save_pretrained(tmp_path / "step1")
    await eng.update_weights(tmp_path / "step1", weight_version="step1")
    after = await eng.generate(prompt, sp)
    assert after.metrics["weight_version"] == "step1"
    assert after.token_ids != before.token_ids
    diff = (torch.tensor(after.logprobs) - _recompute(new, prompt, after.token_ids, 1.0)).abs().max().item()
    assert diff < 1e-4
    from agentrl.inference.base import EngineError

    with pytest.raises(EngineError, match="failed"):
        await eng.update_weights(tmp_path / "missing")
    await eng.close()


async def test_abort_request_by_rid(server):
    """An abort that finds the request live ends it with finish_reason "abort" and its partial output. Whether
    the abort lands before the request's last token is a race the server settles and reports (`aborted`: 1 or
    0), so the test asserts on what the server says happened and tries again when the request finished first."""
    eng = _client(server)
    landed = 0
    async with httpx.AsyncClient(base_url=server, timeout=30) as http:
        for attempt in range(5):
            rid = f"long-{attempt}"
            task = asyncio.create_task(eng.generate(
                [1, 2, 3], SamplingParams(max_new_tokens=250, temperature=0, ignore_eos=True), request_id=rid))
            for _ in range(500):  # until the server is decoding it
                if (await http.get("/get_server_info")).json()["num_running"] > 0:
                    break
                await asyncio.sleep(0.01)
            r = await http.post("/abort_request", json={"rid": rid})
            g = await task
            if r.json()["aborted"]:
                assert g.finish_reason == "abort" and len(g.token_ids) <= 250
                assert g.metrics["finish_detail"]["type"] == "abort"
                landed += 1
                break
            assert g.finish_reason == "length" and len(g.token_ids) == 250  # it had finished: nothing aborted
    assert landed == 1
    await eng.abort("no-such-request")  # the client's abort: unknown ids are not an error
    await eng.close()
