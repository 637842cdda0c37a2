"""LoRA adapters on `agentrl engine serve` (server.py + lora_serving.py), in process over ASGI: requests naming an
adapter sample from the base weights with the adapter merged in, SGLang's load/unload rules, and what a user
sees when an adapter cannot be served."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import httpx
import pytest
import torch
from helpers import peft_lora_model

from agentrl.inference import EngineConfig
from agentrl.inference.local import LocalEngine
from agentrl.inference.server import LoraOptions, create_app
from agentrl.trainer.algos import logprobs_from_logits

peft = pytest.importorskip("peft", reason="peft builds the reference adapters")

PROMPT = [11, 12, 13, 14, 15, 16]


@pytest.fixture(scope="module")
def adapters(tiny_model_dir, tmp_path_factory) -> dict[str, tuple[Path, object]]:
    """name -> (directory peft wrote, the peft model), two different adapters."""
    root = tmp_path_factory.mktemp("adapters")
    out = {}
    for name, seed in (("a1", 1), ("a2", 2)):
        model = peft_lora_model(tiny_model_dir, seed)
        model.save_pretrained(root / name)
        out[name] = (root / name, model)
    return out


def _logprobs(model, prompt: list[int], out: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + out])).logits[0, len(prompt) - 1:-1]
    return logprobs_from_logits(logits, torch.tensor(out), temperature=1.0)


def _serve(model_dir: Path, **app_options):
    engine = LocalEngine.from_pretrained(model_dir, EngineConfig(max_batch_size=4, max_model_len=96))
    app = create_app(engine, str(model_dir), **app_options)
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://serve", timeout=120)
    return engine, app.state.server, http


@pytest.fixture
async def served(tiny_model_dir):
    """(HTTP client, the server object behind it) of a server with --enable-lora --max-loaded-loras 2."""
    engine, server, http = _serve(tiny_model_dir, lora=LoraOptions(max_loaded=2))
    yield http, server
    await http.aclose()
    server.lora.close_sync()
    engine.close_sync()


@pytest.fixture
def serve(served):
    return served[0]


async def _until(condition) -> None:
    """Wait for `condition()`, which the code under test makes true without any timing involved."""
    for _ in range(6000):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the condition never held")


def _body(n: int = 8, **extra) -> dict:
    return {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": n, "temperature": 1.0, "sampling_seed": 5},
            "return_logprob": True, **extra}


def _tokens(answer: dict) -> tuple[list[int], torch.Tensor]:
    return answer["output_ids"], torch.tensor([e[0] for e in answer["meta_info"]["output_token_logprobs"]])


async def _load(http, name: str, path) -> httpx.Response:
    return await http.post("/load_lora_adapter", json={"lora_name": name, "lora_path": str(path)})


async def test_a_request_naming_the_adapter_samples_from_it(serve, adapters):
    path, model = adapters["a1"]
    r = await _load(serve, "a1", path)
    assert r.status_code == 200 and r.json() == {"success": True, "error_message": "",
                                                  "loaded_adapters": {"a1": str(path)}}
    r = await serve.post("/generate", json=_body(lora_path=["a1", None]) | {"input_ids": [PROMPT, PROMPT]})
    tuned, base = r.json()
    assert tuned["meta_info"]["weight_version"] == "a1"  # the adapter's tokens carry its name
    assert base["meta_info"]["weight_version"] == "default"
    ids, logprobs = _tokens(tuned)
    assert (logprobs - _logprobs(model, PROMPT, ids)).abs().max() < 1e-4  # peft's forward with the adapter
    base_ids, base_logprobs = _tokens(base)
    with model.disable_adapter():
        assert (base_logprobs - _logprobs(model, PROMPT, base_ids)).abs().max() < 1e-4
        moved = (_logprobs(model, PROMPT, ids) - logprobs).abs().max()
    assert moved > 0.05  # the adapter changes the distribution: the first check is not base against base
    assert (await serve.get("/get_model_info")).json()["weight_version"] == "a1"  # loading moved the version
    r = await serve.post("/unload_lora_adapter", json={"lora_name": "a1"})
    assert r.status_code == 200 and r.json()["loaded_adapters"] == {}
    assert (await serve.get("/get_model_info")).json()["weight_version"] == "default"
    r = await serve.post("/generate", json=_body(lora_path="a1"))
    assert r.status_code == 400
    assert "LoRA adapter 'a1' (lora_path) is not loaded on this server" in r.json()["error"]["message"]
    r = await serve.post("/unload_lora_adapter", json={"lora_name": "a1"})
    assert r.status_code == 400 and r.json()["error_message"] == "LoRA with name a1 does not exist. Loaded LoRAs: []"


async def test_sglangs_load_rules_and_least_recently_used_unload(serve, adapters, tmp_path):
    assert (await _load(serve, "a1", adapters["a1"][0])).status_code == 200
    r = await _load(serve, "a1", adapters["a2"][0])
    assert r.status_code == 400 and r.json()["error_message"].startswith(
        "Failed to load LoRA adapter a1 because it is already loaded")
    broken = tmp_path / "broken"
    shutil.copytree(adapters["a2"][0], broken)
    (broken / "adapter_model.safetensors").unlink()
    r = await _load(serve, "bad", broken)
    assert r.status_code == 400 and f"{broken} has no adapter_model.safetensors" in r.json()["error_message"]
    assert r.json()["loaded_adapters"] == {"a1": str(adapters["a1"][0])}  # what it had, still served
    assert (await serve.post("/generate", json=_body(lora_path="a1"))).status_code == 200
    r = await serve.post("/generate", json=_body(lora_path=["a1"]) | {"input_ids": [PROMPT, PROMPT]})
    assert r.status_code == 400 and "lora_path has 1 entries but the batch has 2 inputs" in r.json()["error"]["message"]
    assert (await _load(serve, "a2", adapters["a2"][0])).status_code == 200
    assert (await serve.post("/generate", json=_body(lora_path="a1"))).status_code == 200  # a2 is now the older use
    r = await _load(serve, "a3", adapters["a2"][0])  # a third, over max_loaded=2: a2 goes
    assert r.status_code == 200 and sorted(r.json()["loaded_adapters"]) == ["a1", "a3"]
    info = (await serve.get("/get_server_info")).json()
    assert info["enable_lora"] is True and sorted(info["loaded_adapters"]) == ["a1", "a3"]


async def test_unload_waits_for_the_adapters_requests_in_flight(served, adapters):
    serve, server = served
    assert (await _load(serve, "a1", adapters["a1"][0])).status_code == 200
    await serve.post("/pause_generation", json={"mode": "in_place"})
    request = asyncio.create_task(serve.post("/generate", json=_body(n=6, lora_path="a1")))
    adapter_engine = server.lora.engines()[0]
    await _until(lambda: adapter_engine.num_waiting == 1)  # held there: the engine is paused
    unload = asyncio.create_task(serve.post("/unload_lora_adapter", json={"lora_name": "a1"}))
    await _until(lambda: "a1" not in server.lora.loaded())
    refused = await serve.post("/generate", json=_body(lora_path="a1"))
    assert refused.status_code == 400  # no new request may name it once the unload began
    assert not request.done() and not unload.done()  # both wait: the paused engine cannot finish the request
    await serve.post("/continue_generation", json={})
    answer = (await request).json()
    assert len(answer["output_ids"]) == 6 and answer["meta_info"]["weight_version"] == "a1"
    assert (await unload).json()["success"] is True


async def test_new_base_weights_get_the_adapter_merged_again(serve, adapters, tiny_model_dir, tmp_path):
    from agentrl.models.tiny import build_tiny_model

    other = build_tiny_model(tmp_path / "other", size="tiny", seed=7)
    path = adapters["a1"][0]
    assert (await _load(serve, "a1", path)).status_code == 200
    r = await serve.post("/update_weights_from_disk", json={"model_path": str(other), "weight_version": "step-1"})
    assert r.status_code == 200
    assert (await serve.get("/get_model_info")).json()["weight_version"] == "step-1"  # newer than the adapter
    ids, logprobs = _tokens((await serve.post("/generate", json=_body(lora_path="a1"))).json())
    from transformers import AutoModelForCausalLM

    reference = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(other), path).eval()
    assert (logprobs - _logprobs(reference, PROMPT, ids)).abs().max() < 1e-4


async def test_a_server_without_lora_or_with_launch_limits_refuses_by_name(tiny_model_dir, adapters, tmp_path):
    path = adapters["a1"][0]
    cases = [({}, "LoRA is not enabled. Start agentrl engine serve with --enable-lora"),
             ({"lora": LoraOptions(max_rank=2)}, "rank 4, above this server's --max-lora-rank 2"),
             ({"lora": LoraOptions(target_modules=("q_proj", "v_proj"))}, "adapts ['down_proj', 'o_proj']"),
             ({"lora": LoraOptions(), "weights_dir": tmp_path}, "is not under this server's --weights-dir")]
    for options, expected in cases:
        engine, _, http = _serve(tiny_model_dir, **options)
        async with http:
            r = await _load(http, "a1", path)
            assert r.status_code in (400, 403) and expected in r.json()["error_message"], (options, r.json())
            if not options:
                r = await http.post("/generate", json=_body(lora_path="a1"))
                assert r.status_code == 400 and "LoRA is not enabled" in r.json()["error"]["message"]
        engine.close_sync()
