"""SGLangEngine against scripted SGLang servers (httpx.MockTransport): wire format, routing, retries, control."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from agentrl.inference import EngineConfig, EngineError, PromptTooLongError
from agentrl.inference.launcher import SGLangLaunchSpec, sglang_server_commands
from agentrl.inference.sglang import SGLangEngine
from agentrl.types import SamplingParams

URLS = ["http://s0:30000", "http://s1:30001"]


class FakeServers:
    """Answers like SGLang 0.5: echoes max_new_tokens ids with logprobs; records every request."""

    def __init__(self, down: set[str] = frozenset(), delay: float = 0.0):
        self.down = set(down)
        self.delay = delay
        self.calls: list[tuple[str, str, dict]] = []

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        host = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        body = json.loads(request.content) if request.content else {}
        self.calls.append((host, request.url.path, body))
        if host in self.down:
            raise httpx.ConnectError("connection refused", request=request)
        if request.url.path == "/health":
            return httpx.Response(200, json={})
        if request.url.path == "/generate":
            await asyncio.sleep(self.delay)
            if len(body["input_ids"]) > 100:
                return httpx.Response(400, json={"error": {"message": "The input (101 tokens) is longer than the "
                                                           "model's context length (100 tokens)."}})
            n = body["sampling_params"]["max_new_tokens"]
            ids = list(range(7, 7 + n))
            meta = {"id": "x", "finish_reason": {"type": "stop", "matched": ids[-1]}, "prompt_tokens": 3,
                    "completion_tokens": n, "cached_tokens": 2, "e2e_latency": 0.01, "weight_version": "v1",
                    "output_token_logprobs": [[-0.5, t, None] for t in ids]}
            return httpx.Response(200, json={"text": "", "output_ids": ids, "meta_info": meta})
        if request.url.path == "/update_weights_from_disk":
            ok = body["model_path"] != "/bad"
            return httpx.Response(200 if ok else 400, json={"success": ok, "message": "no such dir" if not ok else ""})
        return httpx.Response(200, json={"success": True})


def _engine(fake: FakeServers, retries: int = 2) -> SGLangEngine:
    cfg = EngineConfig(backend="sglang", urls=URLS, connect_retries=retries, retry_backoff_s=0.0,
                       health_timeout_s=1.0)
    return SGLangEngine(URLS, cfg, transport=httpx.MockTransport(fake))


async def test_request_sends_every_sampling_value_and_parses_logprobs():
    fake = FakeServers()
    eng = _engine(fake)
    g = await eng.generate([1, 2, 3], SamplingParams(max_new_tokens=4, temperature=0.7, top_p=0.9, top_k=20,
                                                     stop=["</answer>"], stop_token_ids=[5], seed=11))
    await eng.close()
    assert g.token_ids == [7, 8, 9, 10] and g.logprobs == [-0.5] * 4 and g.finish_reason == "stop"
    assert g.metrics["weight_version"] == "v1" and g.metrics["cached_tokens"] == 2
    body = next(b for _, path, b in fake.calls if path == "/generate")
    sp = body["sampling_params"]
    assert body["input_ids"] == [1, 2, 3] and body["return_logprob"] is True and body["logprob_start_len"] == -1
    assert sp == {"max_new_tokens": 4, "temperature": 0.7, "top_p": 0.9, "top_k": 20, "min_p": 0.0,
                  "repetition_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0,
                  "min_new_tokens": 0, "ignore_eos": False, "stop": ["</answer>"], "stop_token_ids": [5],
                  "skip_special_tokens": False, "no_stop_trim": True, "n": 1, "sampling_seed": 11}


async def test_sessions_stick_and_new_sessions_go_to_least_loaded():
    fake = FakeServers(delay=0.05)
    eng = _engine(fake)
    sp = SamplingParams(max_new_tokens=2)
    # two concurrent episodes land on different servers, then each episode's later turns stay put
    await asyncio.gather(eng.generate([1], sp, session_id="ep-a"), eng.generate([1], sp, session_id="ep-b"))
    a, b = eng.server_for("ep-a"), eng.server_for("ep-b")
    assert {a, b} == set(URLS)
    fake.calls.clear()
    await asyncio.gather(*[eng.generate([1, 2], sp, session_id="ep-a") for _ in range(3)])
    assert {host for host, path, _ in fake.calls if path == "/generate"} == {a}
    await eng.close()


async def test_connection_errors_retry_on_another_server_then_fail_clearly():
    fake = FakeServers()
    eng = _engine(fake)
    await eng.start()
    fake.down = {URLS[0]}
    for i in range(4):
        g = await eng.generate([1], SamplingParams(max_new_tokens=1), session_id=f"s{i}")
        assert g.metrics["server"] == URLS[1]
    fake.down = set(URLS)
    with pytest.raises(EngineError, match=r"after 3 attempt\(s\)"):
        await eng.generate([1], SamplingParams(max_new_tokens=1))
    await eng.close()


async def test_prompt_too_long_and_unhealthy_servers():
    eng = _engine(FakeServers())
    with pytest.raises(PromptTooLongError, match="context length"):
        await eng.generate(list(range(101)), SamplingParams(max_new_tokens=1))
    await eng.close()
    dead = _engine(FakeServers(down={URLS[1]}))
    with pytest.raises(EngineError, match="not healthy"):
        await dead.generate([1], SamplingParams(max_new_tokens=1))
    await dead.close()


async def test_update_weights_goes_to_every_server():
    fake = FakeServers()
    eng = _engine(fake)
    await eng.update_weights("/ckpt/step-3", weight_version="3")
    calls = [(h, b) for h, path, b in fake.calls if path == "/update_weights_from_disk"]
    assert sorted(h for h, _ in calls) == URLS
    assert all(b == {"model_path": "/ckpt/step-3", "abort_all_requests": False, "flush_cache": True,
                     "weight_version": "3"} for _, b in calls)
    with pytest.raises(EngineError, match="no such dir"):
        await eng.update_weights("/bad")
    with pytest.raises(TypeError, match="checkpoint directory"):
        await eng.update_weights({"w": 1})
    await eng.close()


def test_launcher_command_lines_spread_gpus():
    spec = SGLangLaunchSpec(model_path="/models/qwen", num_servers=2, tp=2, base_port=31000,
                            mem_fraction_static=0.6, context_length=8192, extra_args=["--log-level", "warning"])
    (env0, cmd0), (env1, cmd1) = sglang_server_commands(spec)
    assert env0 == {"CUDA_VISIBLE_DEVICES": "0,1"} and env1 == {"CUDA_VISIBLE_DEVICES": "2,3"}
    assert cmd0[1:3] == ["-m", "sglang.launch_server"]
    joined = " ".join(cmd1)
    for flag in ("--model-path /models/qwen", "--port 31001", "--tp-size 2", "--mem-fraction-static 0.6",
                 "--context-length 8192", "--enable-memory-saver", "--host 127.0.0.1", "--log-level warning"):
        assert flag in joined
    assert spec.urls == ["http://127.0.0.1:31000", "http://127.0.0.1:31001"]
    with pytest.raises(ValueError, match="need 4 GPUs"):
        SGLangLaunchSpec(model_path="m", num_servers=2, tp=2, gpus=[0, 1])


async def test_cancelled_generate_aborts_its_request_on_the_server():
    fake = FakeServers(delay=0.5)
    eng = _engine(fake)
    task = asyncio.create_task(eng.generate([1], SamplingParams(max_new_tokens=2), request_id="ep7-turn2"))
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.05)
    aborts = [(host, b) for host, path, b in fake.calls if path == "/abort_request"]
    generates = [host for host, path, _ in fake.calls if path == "/generate"]
    assert aborts == [(generates[0], {"rid": "ep7-turn2"})]
    assert eng.in_flight == [0, 0]
    await eng.close()


def test_launch_sglang_cli_dry_run_prints_one_command_per_server(capsys):
    from agentrl.cli import main

    assert main(["engine", "launch-sglang", "--model", "/models/qwen", "--num-servers", "2", "--tp", "1",
                 "--gpus", "4,5", "--dry-run", "--", "--log-level", "warning"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("CUDA_VISIBLE_DEVICES=4 ") and lines[1].startswith("CUDA_VISIBLE_DEVICES=5 ")
    assert "--port 30001" in lines[1] and lines[1].endswith("--log-level warning")


async def test_pause_and_continue_go_to_every_server_and_an_unpaused_abort_is_returned():
    fake = FakeServers()
    eng = _engine(fake)
    await eng.pause_generation("retract")
    await eng.continue_generation()
    calls = [(h, path, b) for h, path, b in fake.calls if path in ("/pause_generation", "/continue_generation")]
    assert sorted(calls) == sorted([(u, "/pause_generation", {"mode": "retract"}) for u in URLS]
                                   + [(u, "/continue_generation", {}) for u in URLS])
    with pytest.raises(ValueError, match="in_place"):
        await eng.pause_generation("drain")
    await eng.close()


class PausingServer:
    """One SGLang server with per-request version labels only (as real SGLang): the first /generate is held until
    `release` is set, then answers aborted with 3 tokens; later ones answer in full under `label`."""

    def __init__(self):
        self.release = asyncio.Event()
        self.label = "4"
        self.generates: list[dict] = []

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else {}
        if request.url.path != "/generate":
            return httpx.Response(200, json={"success": True})
        self.generates.append(body)
        first = len(self.generates) == 1
        if first:
            await self.release.wait()
        n = 3 if first else body["sampling_params"]["max_new_tokens"]
        ids = list(range(50 + len(body["input_ids"]), 50 + len(body["input_ids"]) + n))
        reason = {"type": "abort", "message": "paused"} if first else {"type": "length", "length": n}
        meta = {"finish_reason": reason, "weight_version": self.label, "prompt_tokens": len(body["input_ids"]),
                "output_token_logprobs": [[-1.0, t, None] for t in ids]}
        return httpx.Response(200, json={"text": "", "output_ids": ids, "meta_info": meta})


async def test_a_request_aborted_by_our_pause_resumes_with_the_tokens_so_far():
    fake = PausingServer()
    eng = SGLangEngine([URLS[0]], EngineConfig(backend="sglang", urls=[URLS[0]], health_timeout_s=1.0),
                       transport=httpx.MockTransport(fake))
    task = asyncio.ensure_future(eng.generate([1, 2], SamplingParams(max_new_tokens=10, min_new_tokens=5)))
    while not fake.generates:
        await asyncio.sleep(0)
    await eng.pause_generation("abort")
    fake.release.set()
    await eng.update_weights("/ckpt/step-5", weight_version="5")
    fake.label = "5"
    for _ in range(20):
        await asyncio.sleep(0)
    assert not task.done() and len(fake.generates) == 1  # waits for continue_generation
    await eng.continue_generation()
    g = await task
    resumed = fake.generates[1]
    assert resumed["input_ids"] == [1, 2, 52, 53, 54]  # prompt + the tokens of the aborted part
    assert resumed["sampling_params"]["max_new_tokens"] == 7 and resumed["sampling_params"]["min_new_tokens"] == 2
    assert g.token_ids == [52, 53, 54] + list(range(55, 62)) and g.finish_reason == "length"
    assert g.weight_versions == [4] * 3 + [5] * 7 and len(g.logprobs) == 10
    assert g.metrics["resumed_after_pause"] == 1 and g.metrics["prompt_tokens"] == 2
    await eng.close()


async def test_an_abort_by_our_weight_update_says_so_and_another_abort_does_not():
    class AbortingServer(PausingServer):
        """The held /generate answers aborted when an update with abort_all_requests arrives (or on release)."""

        async def __call__(self, request: httpx.Request) -> httpx.Response:
            if request.url.path == "/update_weights_from_disk" and json.loads(request.content)["abort_all_requests"]:
                self.release.set()
            return await super().__call__(request)

    fake = AbortingServer()
    eng = SGLangEngine([URLS[0]], EngineConfig(backend="sglang", urls=[URLS[0]], health_timeout_s=1.0),
                       transport=httpx.MockTransport(fake))
    task = asyncio.ensure_future(eng.generate([1, 2], SamplingParams(max_new_tokens=10)))
    while not fake.generates:
        await asyncio.sleep(0)
    await eng.update_weights("/ckpt/step-5", version=5, abort_in_flight=True)
    g = await task
    assert g.finish_reason == "abort" and g.token_ids == [52, 53, 54]
    assert g.metrics["aborted_by"] == "weight_update" and len(fake.generates) == 1  # not resumed: the caller redoes it

    fake.generates.clear()  # an abort nobody here asked for (another client, an operator) stays a plain abort
    fake.release = asyncio.Event()
    task = asyncio.ensure_future(eng.generate([1, 2], SamplingParams(max_new_tokens=10)))
    while not fake.generates:
        await asyncio.sleep(0)
    fake.release.set()
    g = await task
    assert g.finish_reason == "abort" and "aborted_by" not in g.metrics
    await eng.close()
