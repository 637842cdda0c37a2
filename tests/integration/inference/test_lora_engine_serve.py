"""LoRA adapters on real `agentrl engine serve --enable-lora` processes on loopback, behind a token: SGLang's
/load_lora_adapter and /unload_lora_adapter, /generate naming the adapter sampling what peft's own forward gives,
the refusals a user meets, and `lora_sync.push_adapter` serving each step's adapter from two servers."""

from __future__ import annotations

import contextlib
import sys

import httpx
import pytest
import torch
from helpers import free_port, peft_lora_model, service

from agentrl.inference import EngineConfig
from agentrl.inference.sglang import SGLangEngine
from agentrl.trainer.algos import logprobs_from_logits
from agentrl.trainer.lora_sync import push_adapter
from agentrl.types import SamplingParams

pytestmark = pytest.mark.slow
pytest.importorskip("peft", reason="peft builds the adapters")

TOKEN = "s3cret-lora-token"
PROMPT = [31, 32, 33, 34, 35, 36, 37]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("lora-run")


@pytest.fixture(scope="module")
def adapters(tiny_model_dir, run_dir):
    """Two steps' adapters as the trainer writes them: [(directory, peft model)]."""
    out = []
    for step in (1, 2):
        model = peft_lora_model(tiny_model_dir, seed=step)
        model.save_pretrained(run_dir / "weights" / f"lora_step_{step}")
        out.append((run_dir / "weights" / f"lora_step_{step}", model))
    return out


@pytest.fixture(scope="module")
def urls(tiny_model_dir, run_dir):
    token_file = run_dir / "token"
    token_file.write_text(TOKEN)
    token_file.chmod(0o600)
    (run_dir / "weights").mkdir(exist_ok=True)
    with contextlib.ExitStack() as stack:
        out = []
        for _ in range(2):
            port = free_port()
            out.append(f"http://127.0.0.1:{port}")
            stack.enter_context(service(
                [sys.executable, "-m", "agentrl.cli", "engine", "serve", "--model", str(tiny_model_dir), "--port",
                 str(port), "--max-model-len", "128", "--num-threads", "1", "--token-file", str(token_file),
                 "--weights-dir", str(run_dir / "weights"), "--enable-lora", "--max-lora-rank", "8"],
                f"{out[-1]}/health", timeout=120))
        yield out


def _logprobs(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT + ids])).logits[0, len(PROMPT) - 1:-1]
    return logprobs_from_logits(logits, torch.tensor(ids), temperature=1.0)


def _answer(r: httpx.Response) -> tuple[list[int], torch.Tensor]:
    assert r.status_code == 200, r.text
    body = r.json()
    return body["output_ids"], torch.tensor([e[0] for e in body["meta_info"]["output_token_logprobs"]])


async def test_adapter_routes_over_http(urls, adapters, run_dir):
    path, model = adapters[0]
    generate = {"input_ids": PROMPT, "return_logprob": True,
                "sampling_params": {"max_new_tokens": 10, "temperature": 1.0, "sampling_seed": 3}}
    async with httpx.AsyncClient(base_url=urls[0], timeout=120,
                                 headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        async with httpx.AsyncClient(base_url=urls[0], timeout=30) as stranger:
            r = await stranger.post("/load_lora_adapter", json={"lora_name": "tuned", "lora_path": str(path)})
            assert r.status_code == 401  # the token guards the LoRA routes as every other
        r = await http.post("/load_lora_adapter", json={"lora_name": "tuned", "lora_path": str(path)})
        assert r.status_code == 200 and r.json()["loaded_adapters"] == {"tuned": str(path)}
        ids, logprobs = _answer(await http.post("/generate", json={**generate, "lora_path": "tuned"}))
        assert (logprobs - _logprobs(model, ids)).abs().max() < 1e-4  # peft's forward with the adapter
        ids, logprobs = _answer(await http.post("/generate", json=generate))
        with model.disable_adapter():
            assert (logprobs - _logprobs(model, ids)).abs().max() < 1e-4  # the base model's
        assert (await http.get("/get_model_info")).json()["weight_version"] == "tuned"

        r = await http.post("/generate", json={**generate, "lora_path": "other"})
        assert r.status_code == 400 and r.json()["error"]["message"].startswith(
            "LoRA adapter 'other' (lora_path) is not loaded on this server")
        (run_dir / "weights" / "empty").mkdir(exist_ok=True)
        r = await http.post("/load_lora_adapter", json={"lora_name": "broken", "lora_path": str(
            run_dir / "weights" / "empty")})
        assert r.status_code == 400 and "has no adapter_config.json or adapter_model.safetensors" in (
            r.json()["error_message"])
        r = await http.post("/load_lora_adapter", json={"lora_name": "outside", "lora_path": str(run_dir)})
        assert r.status_code == 403 and "--weights-dir" in r.json()["error_message"]
        _answer(await http.post("/generate", json={**generate, "lora_path": "tuned"}))  # still served
        r = await http.post("/unload_lora_adapter", json={"lora_name": "tuned"})
        assert r.status_code == 200 and r.json()["loaded_adapters"] == {}
        assert (await http.post("/generate", json={**generate, "lora_path": "tuned"})).status_code == 400
        assert (await http.get("/get_model_info")).json()["weight_version"] == "default"


async def test_push_adapter_serves_each_step_from_both_servers(urls, adapters, run_dir):
    client = SGLangEngine(urls, EngineConfig(backend="sglang", urls=urls, token_file=str(run_dir / "token"),
                                             health_timeout_s=60))
    try:
        for step, (path, model) in enumerate(adapters, start=1):
            await push_adapter(client, path, version=step)
            gens = [await client.generate(PROMPT, SamplingParams(max_new_tokens=8, temperature=1.0, seed=i),
                                          session_id=f"step{step}-ep{i}") for i in range(2)]
            for gen in gens:
                assert gen.weight_versions == [step] * 8
                assert (torch.tensor(gen.logprobs) - _logprobs(model, gen.token_ids)).abs().max() < 1e-4
            async with httpx.AsyncClient(timeout=30, headers={"Authorization": f"Bearer {TOKEN}"}) as http:
                for url in urls:
                    info = (await http.get(f"{url}/get_server_info")).json()
                    assert info["loaded_adapters"] == {f"policy-v{step}": str(path.resolve())}
                    assert info["weight_version"] == f"policy-v{step}"
    finally:
        await client.close()
