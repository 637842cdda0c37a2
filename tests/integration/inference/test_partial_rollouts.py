"""SGLang's pause/continue protocol and weight version labels, end to end on `agentrl engine serve` (loopback)."""

from __future__ import annotations

import asyncio
import sys

import httpx
import pytest
import torch

from helpers import forcing_weights, free_port, service

pytestmark = pytest.mark.slow

PROMPT = [17, 402, 96, 1203, 58, 77, 311, 940, 12, 2047, 33]


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
        assert meta["weight_version"] == "step-2" and meta["weight_versions"] == ["step-2"] * 5
        bad = await http.post("/pause_generation", json={"mode": "drain"})
        assert bad.status_code == 400 and "in_place" in bad.json()["error"]["message"]
