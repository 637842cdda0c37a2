"""Partial rollouts over SGLang's pause/continue protocol, end to end: `agentrl engine serve` on loopback and
`SGLangEngine`. A long generation is paused (abort), the weights are updated with a new version label, generation
continues, and the client's one Generation carries, per token, the version that sampled it."""

from __future__ import annotations

import asyncio
import sys

import httpx
import pytest
import torch
from helpers import forcing_weights, free_port, service

from agentrl.inference import EngineConfig
from agentrl.inference.sglang import SGLangEngine
from agentrl.trainer.algos import logprobs_from_logits
from agentrl.types import SamplingParams

pytestmark = pytest.mark.slow

PROMPT = [17, 402, 96, 1203, 58, 77, 311, 940, 12, 2047, 33]
LONG = SamplingParams(max_new_tokens=1500, temperature=0, ignore_eos=True)


@pytest.fixture
def server(tiny_model_dir):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = [sys.executable, "-m", "agentrl.cli", "engine", "serve", "--model", str(tiny_model_dir), "--port",
            str(port), "--max-batch-size", "4", "--max-model-len", "2048", "--num-threads", "1"]
    with service(args, f"{url}/health", timeout=120):
        yield url


@pytest.fixture
def model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


async def _until(http: httpx.AsyncClient, key: str, n: int) -> None:
    """Poll /get_server_info until `key` (num_running: rows decoding, each holding at least its first token;
    num_waiting: queued requests) reaches `n`."""
    while (await http.get("/get_server_info")).json()[key] < n:
        await asyncio.sleep(0.005)


async def test_a_generation_paused_for_an_update_resumes_on_the_new_weights(server, model, tmp_path):
    eng = SGLangEngine([server], EngineConfig(backend="sglang", urls=[server], health_timeout_s=30))
    reference = await eng.generate(PROMPT, SamplingParams(max_new_tokens=64, temperature=0, ignore_eos=True))
    assert reference.weight_versions == [0] * 64  # "default": the weights the server started with
    forcing, forced = forcing_weights(model, set(reference.token_ids))
    model.load_state_dict(forcing)
    model.save_pretrained(tmp_path / "step7")

    async with httpx.AsyncClient(base_url=server, timeout=60) as http:
        task = asyncio.ensure_future(eng.generate(PROMPT, LONG))
        await _until(http, "num_running", 1)
        await eng.pause_generation("abort")
        await eng.update_weights(tmp_path / "step7", weight_version="7")
        assert not task.done()  # the aborted part waits for continue_generation
        await eng.continue_generation()
        g = await task
        info = (await http.get("/get_model_info")).json()

    assert info["weight_version"] == "7"
    assert g.finish_reason == "length" and len(g.token_ids) == len(g.weight_versions) == 1500
    split = g.weight_versions.count(0)
    assert 1 <= split < 1500 and g.weight_versions == [0] * split + [7] * (1500 - split)
    assert g.metrics["resumed_after_pause"] == 1 and g.metrics["weight_version"] == "7"
    assert g.token_ids[:min(split, 64)] == reference.token_ids[:min(split, 64)]  # old weights' greedy output
    assert g.token_ids[split:] == [forced] * (1500 - split)  # the new weights', from the first token after
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT + g.token_ids])).logits[0, len(PROMPT) - 1:-1]
    new_lp = logprobs_from_logits(logits, torch.tensor(g.token_ids), temperature=1.0)
    assert (torch.tensor(g.logprobs[split:]) - new_lp[split:]).abs().max().item() < 1e-4
    await eng.close()


async def test_requests_wait_while_paused_and_report_per_token_labels(server, model, tmp_path):
    forcing, forced = forcing_weights(model, set())
    model.load_state_dict(forcing)
    model.save_pretrained(tmp_path / "next")
    async with httpx.AsyncClient(base_url=server, timeout=60) as http:
        r = await http.post("/pause_generation", json={"mode": "retract"})
        assert r.status_code == 200
        assert (await http.get("/get_server_info")).json()["paused"] is True
        held = asyncio.ensure_future(http.post("/generate", json={
            "input_ids": PROMPT, "sampling_params": {"max_new_tokens": 5, "temperature": 0, "ignore_eos": True}}))
        await _until(http, "num_waiting", 1)
        r = await http.post("/update_weights_from_disk", json={
            "model_path": str(tmp_path / "next"), "weight_version": "step-2", "flush_cache": True})
        assert r.json()["success"] is True
        assert not held.done()  # sent while paused: waits, is not lost
        assert (await http.post("/continue_generation", json={})).status_code == 200
        meta = (await held).json()["meta_info"]
        assert meta["weight_version"] == "step-2"
        assert meta["weight_versions"] == [{"version": "step-2", "start": 0, "end": 5}]  # SGLang's spans
        bad = await http.post("/pause_generation", json={"mode": "drain"})
        assert bad.status_code == 400 and "in_place" in bad.json()["error"]["message"]


async def test_an_update_that_aborts_requests_says_why_over_http(server, model, tmp_path):
    """`rollout.on_weight_update: abort` against a server: the request in flight ends with "abort" and the cause
    the agent loop restarts a turn on, with the tokens it had sampled under the old weights."""
    eng = SGLangEngine([server], EngineConfig(backend="sglang", urls=[server], health_timeout_s=30))
    model.save_pretrained(tmp_path / "step3")
    async with httpx.AsyncClient(base_url=server, timeout=60) as http:
        task = asyncio.ensure_future(eng.generate(PROMPT, LONG))
        await _until(http, "num_running", 1)
        await eng.update_weights(tmp_path / "step3", version=3, abort_in_flight=True)
        g = await task
    assert g.finish_reason == "abort" and g.metrics["aborted_by"] == "weight_update"
    assert 1 <= len(g.token_ids) < 1500 and set(g.weight_versions) == {0}
    assert eng.weight_version == 3
    await eng.close()
