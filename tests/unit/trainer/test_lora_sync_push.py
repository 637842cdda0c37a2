"""`agentrl.trainer.lora_sync.push_adapter` through SGLangEngine to two `agentrl engine serve --enable-lora` apps
(in process, over ASGI): each step's adapter is served from both and the previous one unloaded, tokens record
the version of the adapter that sampled them, a refused push names the server and changes nothing, and requests
in flight continue under the new adapter or end with "abort" as asked."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import torch
from helpers import peft_lora_model

from agentrl.errors import WeightSyncError
from agentrl.inference import EngineConfig
from agentrl.inference.local import LocalEngine
from agentrl.inference.server import LoraOptions, create_app
from agentrl.inference.sglang import SGLangEngine
from agentrl.trainer.algos import logprobs_from_logits
from agentrl.trainer.lora_sync import adapter_name, push_adapter
from agentrl.types import SamplingParams

pytest.importorskip("peft", reason="peft builds the adapters")

URLS = ["http://s0", "http://s1"]
PROMPT = [21, 22, 23, 24, 25]


class _ByHost(httpx.AsyncBaseTransport):
    """Each request goes to the app serving its URL's host."""

    def __init__(self, apps: dict):
        self.transports = {host: httpx.ASGITransport(app=app) for host, app in apps.items()}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self.transports[request.url.host].handle_async_request(request)


@pytest.fixture(scope="module")
def adapters(tiny_model_dir, tmp_path_factory):
    """Two adapters under a weights directory: [(directory, peft model)]."""
    root = tmp_path_factory.mktemp("run") / "weights"
    out = []
    for seed in (1, 2):
        model = peft_lora_model(tiny_model_dir, seed)
        model.save_pretrained(root / f"lora_{seed}")
        out.append((root / f"lora_{seed}", model))
    return out


@pytest.fixture
async def servers(tiny_model_dir, adapters):
    """(client, {host: server}); s1 loads weights only from under the adapters' directory (--weights-dir)."""
    engines, apps = [], {}
    for i, url in enumerate(URLS):
        engine = LocalEngine.from_pretrained(tiny_model_dir, EngineConfig(max_batch_size=4, max_model_len=64))
        weights_dir = adapters[0][0].parent.resolve() if i == 1 else None
        apps[url.removeprefix("http://")] = create_app(engine, str(tiny_model_dir), lora=LoraOptions(),
                                                       weights_dir=weights_dir)
        engines.append(engine)
    client = SGLangEngine(URLS, EngineConfig(backend="sglang", urls=URLS, health_timeout_s=5),
                          transport=_ByHost(apps))
    yield client, {host: app.state.server for host, app in apps.items()}
    await client.close()
    for app, engine in zip(apps.values(), engines):
        app.state.server.lora.close_sync()
        engine.close_sync()


def _reference(model, gen) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT + gen.token_ids])).logits[0, len(PROMPT) - 1:-1]
    return logprobs_from_logits(logits, torch.tensor(gen.token_ids), temperature=1.0)


async def _sample(client, n: int = 4) -> list:
    return await asyncio.gather(*[client.generate(PROMPT, SamplingParams(max_new_tokens=6, temperature=0),
                                                  session_id=f"ep{i}") for i in range(n)])


async def test_each_step_is_served_by_both_servers_and_the_last_one_unloaded(servers, adapters):
    client, by_host = servers
    for version, (path, model) in enumerate(adapters, start=1):
        metrics = await push_adapter(client, path, version=version)
        assert metrics["timing/weight_push_s"] >= metrics["timing/lora_load_s"] >= 0
        assert client.lora_adapter == adapter_name(version) == f"policy-v{version}"
        assert client.weight_version == version
        for server in by_host.values():  # the step's adapter only: the one before was unloaded
            assert server.lora.loaded() == {f"policy-v{version}": str(path.resolve())}
        gens = await _sample(client)
        assert {g.metrics["server"] for g in gens} == set(URLS)
        for gen in gens:
            assert gen.weight_versions == [version] * 6 and gen.metrics["lora_adapter"] == f"policy-v{version}"
            assert (torch.tensor(gen.logprobs) - _reference(model, gen)).abs().max() < 1e-4


async def test_a_refused_push_names_the_server_and_keeps_the_adapter_in_use(servers, adapters, tmp_path):
    client, by_host = servers
    await push_adapter(client, adapters[0][0], version=1)
    outside = tmp_path / "elsewhere"
    adapters[1][1].save_pretrained(outside)
    with pytest.raises(WeightSyncError) as err:
        await push_adapter(client, outside, version=2)
    message = str(err.value)
    assert "loading LoRA adapter policy-v2" in message and "http://s1/load_lora_adapter" in message
    assert "--weights-dir" in message and "keep serving policy-v1" in message and "\n" not in message
    for server in by_host.values():  # s0 had loaded it: dropped again, as nothing was pushed
        assert list(server.lora.loaded()) == ["policy-v1"]
    assert client.lora_adapter == "policy-v1"
    assert all(g.weight_versions == [1] * 6 for g in await _sample(client, 2))


def _pause_after_steps(steps: int):
    """A LocalEngine step hook that pauses the engine (requests kept in place) once it made `steps` steps."""
    def hook(engine: LocalEngine) -> None:
        if engine.stats["steps"] >= steps:
            engine.step_hook = None
            engine.pause("in_place")
    return hook


@pytest.mark.parametrize("on_running", ["continue", "abort"])
async def test_requests_in_flight_continue_under_the_new_adapter_or_abort(servers, adapters, on_running):
    client, by_host = servers
    await push_adapter(client, adapters[0][0], version=1)
    adapter_engines = [e for server in by_host.values() for e in server.lora.engines()]
    for engine in adapter_engines:
        engine.step_hook = _pause_after_steps(3)
    task = asyncio.create_task(client.generate(PROMPT, SamplingParams(max_new_tokens=12, temperature=0)))
    for _ in range(6000):  # the hook holds the request after a few tokens, under adapter 1
        if any(e.paused and e.num_running for e in adapter_engines):
            break
        await asyncio.sleep(0.01)
    else:
        raise AssertionError("the request never started on adapter 1")
    await push_adapter(client, adapters[1][0], version=2, on_running=on_running)
    gen = await task
    first = gen.weight_versions.count(1)
    if on_running == "continue":  # the tokens so far keep version 1, the rest come from adapter 2
        assert gen.finish_reason == "length" and len(gen.token_ids) == 12
        assert first >= 1 and gen.weight_versions == [1] * first + [2] * (12 - first)
        assert gen.metrics["resumed_after_pause"] == 1
    else:  # the agent loop samples the turn again
        assert gen.finish_reason == "abort" and gen.metrics["aborted_by"] == "weight_update"
        assert 1 <= len(gen.token_ids) < 12 and gen.weight_versions == [1] * len(gen.token_ids)
    for server in by_host.values():
        assert list(server.lora.loaded()) == ["policy-v2"]
