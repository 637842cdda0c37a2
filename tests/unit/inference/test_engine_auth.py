"""`agentrl engine serve` behind a token and a --weights-dir, and SGLangEngine sending `engine.token_file`."""

from __future__ import annotations

import shutil

import httpx
import pytest

from agentrl.auth import ServiceAuthError
from agentrl.inference import EngineConfig
from agentrl.inference.local import LocalEngine
from agentrl.inference.server import WeightsDirError, check_weights_dir, create_app
from agentrl.inference.sglang import SGLangEngine
from agentrl.types import SamplingParams

TOKEN = "engine-secret-99"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    eng = LocalEngine.from_pretrained(tiny_model_dir, EngineConfig(max_batch_size=2, max_model_len=64))
    yield eng
    eng.close_sync()


@pytest.fixture
def weights(tmp_path, tiny_model_dir):
    """A --weights-dir holding one checkpoint (a copy of the tiny model) and, outside it, another."""
    inside, outside = tmp_path / "weights", tmp_path / "elsewhere"
    shutil.copytree(tiny_model_dir, inside / "step_000001")
    shutil.copytree(tiny_model_dir, outside)
    return inside, outside


def client_for(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://engine")


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer nope"}])
async def test_routes_need_the_token_and_health_does_not(engine, tiny_model_dir, headers):
    async with client_for(create_app(engine, str(tiny_model_dir), token=TOKEN)) as client:
        body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}}
        for method, path, json in [("POST", "/generate", body), ("GET", "/get_model_info", None),
                                   ("POST", "/update_weights_from_disk", {"model_path": str(tiny_model_dir)}),
                                   ("POST", "/pause_generation", None), ("GET", "/health_generate", None)]:
            r = await client.request(method, path, json=json, headers=headers)
            assert r.status_code == 401, (method, path)
        assert (await client.get("/health", headers=headers)).json() == {"status": "ok"}


async def test_the_right_token_generates(engine, tiny_model_dir):
    # ignore_eos: a sampled EOS would end the answer early, and this test is about the token, not the model
    body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2, "ignore_eos": True}}
    async with client_for(create_app(engine, str(tiny_model_dir), token=TOKEN)) as client:
        r = await client.post("/generate", headers=AUTH, json=body)
        assert r.status_code == 200 and len(r.json()["output_ids"]) == 2


async def test_weights_load_only_from_under_the_weights_dir(engine, tiny_model_dir, weights):
    inside, outside = weights
    (inside / "link").symlink_to(outside, target_is_directory=True)
    app = create_app(engine, str(tiny_model_dir), weights_dir=check_weights_dir(str(inside), "127.0.0.1"))
    async with client_for(app) as client:
        for path in [outside, inside / "link", inside / ".." / "elsewhere"]:
            r = await client.post("/update_weights_from_disk", json={"model_path": str(path)})
            assert r.status_code == 403, path
            assert r.json()["success"] is False
            assert f"is not under this server's --weights-dir {inside}" in r.json()["message"]
        before = engine.weight_version
        r = await client.post("/update_weights_from_disk", json={"model_path": str(inside / "step_000001")})
        assert r.status_code == 200 and r.json()["success"] is True
        assert engine.weight_version == before + 1


def test_weights_dir_is_optional_on_loopback_only(tmp_path):
    assert check_weights_dir(None, "127.0.0.1") is None
    assert check_weights_dir(str(tmp_path), "0.0.0.0") == tmp_path.resolve()
    with pytest.raises(WeightsDirError, match="on host 0.0.0.0 needs --weights-dir DIR"):
        check_weights_dir(None, "0.0.0.0")
    with pytest.raises(WeightsDirError, match="is not a directory"):
        check_weights_dir(str(tmp_path / "missing"), "127.0.0.1")


class Server:
    """An SGLang-shaped server that wants `token` (like `--api-key`); records what it was sent."""

    def __init__(self, token: str):
        self.token = token
        self.seen: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request)
        if request.url.path != "/health" and request.headers.get("authorization") != f"Bearer {self.token}":
            return httpx.Response(401, json={"error": "Unauthorized"})
        if request.url.path == "/generate":
            meta = {"id": "r", "finish_reason": {"type": "length"}, "prompt_tokens": 1, "completion_tokens": 1,
                    "weight_version": "default", "output_token_logprobs": [[-0.1, 5, None]]}
            return httpx.Response(200, json={"text": "", "output_ids": [5], "meta_info": meta})
        return httpx.Response(200, json={"success": True})


def secret(tmp_path, token: str):
    path = tmp_path / "engine.token"
    path.write_text(token)
    path.chmod(0o600)
    return path


def sglang(server: Server, token_file: str | None) -> SGLangEngine:
    url = "http://sglang:30000"
    cfg = EngineConfig(backend="sglang", urls=[url], token_file=token_file, health_timeout_s=1.0,
                       connect_retries=3, retry_backoff_s=0.0)
    return SGLangEngine([url], cfg, transport=httpx.MockTransport(server))


async def test_sglang_client_sends_the_token(tmp_path):
    token_file = secret(tmp_path, TOKEN)
    server = Server(TOKEN)
    eng = sglang(server, str(token_file))
    gen = await eng.generate([1], SamplingParams(max_new_tokens=1))
    await eng.close()
    assert gen.token_ids == [5]
    assert [r.url.path for r in server.seen] == ["/health", "/get_model_info", "/generate"]
    assert all(r.headers["authorization"] == f"Bearer {TOKEN}" for r in server.seen)


async def test_a_wrong_token_fails_at_start_naming_the_key(tmp_path):
    token_file = secret(tmp_path, "not-the-token")
    eng = sglang(Server(TOKEN), str(token_file))
    with pytest.raises(ServiceAuthError) as e:
        await eng.start()
    await eng.close()
    assert str(e.value).startswith("SGLang server http://sglang:30000 refused the request with HTTP 401 "
                                   "(Unauthorized): set engine.token_file to the file holding the token")


async def test_no_token_is_one_error_on_the_first_request_not_a_retry_loop():
    server = Server(TOKEN)
    eng = sglang(server, None)
    with pytest.raises(ServiceAuthError, match=r"set engine\.token_file"):
        await eng.generate([1], SamplingParams(max_new_tokens=1))
    with pytest.raises(ServiceAuthError, match=r"set engine\.token_file"):
        await eng.update_weights("/ckpt")
    await eng.close()
    assert [r.url.path for r in server.seen] == ["/health", "/generate", "/update_weights_from_disk"]
