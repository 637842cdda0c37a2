"""The LoRA requests and answers of SGLangEngine and `agentrl engine serve` checked against SGLang's own sources
(the sglang wheel `make setup` downloads, read as text: srt/managers/io_struct.py for the request and answer
classes, srt/entrypoints/http_server.py for the class each route parses, api/v1/api_types.py for /generate's
contract, and the messages SGLang answers that the client relies on)."""

from __future__ import annotations

import ast
import json
import os
import sys
import zipfile
from pathlib import Path

import httpx
import pytest
from helpers import peft_lora_model

from agentrl.inference import EngineConfig
from agentrl.inference.base import EngineError
from agentrl.inference.launcher import lora_launch_args
from agentrl.inference.local import LocalEngine
from agentrl.inference.server import LoraOptions, create_app
from agentrl.inference.sglang import SGLangEngine
from agentrl.types import SamplingParams

SGLANG = "0.5.23"  # the Makefile's SGLANG_WIRE
URL = "http://sglang:30000"
IO_STRUCT = "sglang/srt/managers/io_struct.py"


@pytest.fixture(scope="module")
def wheel():
    named = os.environ.get("AGENTRL_SGLANG_WHEEL")
    found = [Path(named)] if named else sorted((Path(sys.prefix) / "share" / "sglang-wire").glob(
        f"sglang-{SGLANG}-*.whl"))
    if not found:
        pytest.skip(f"the sglang=={SGLANG} wheel is not in {sys.prefix}/share/sglang-wire (`make setup` fetches it)")
    with zipfile.ZipFile(found[0]) as z:
        yield z


def _source(wheel: zipfile.ZipFile, path: str) -> str:
    return wheel.read(path).decode()


def _class_fields(wheel, path: str, name: str) -> dict[str, bool]:
    """field -> whether it is required (no default), of class `name` in `path`."""
    cls = next(n for n in ast.parse(_source(wheel, path)).body if isinstance(n, ast.ClassDef) and n.name == name)
    return {s.target.id: s.value is None for s in cls.body if isinstance(s, ast.AnnAssign)}


def _route_class(wheel, route: str) -> str:
    """The class SGLang's route parses its JSON body into (`obj: Annotated[Cls, Body()]`)."""
    for node in ast.walk(ast.parse(_source(wheel, "sglang/srt/entrypoints/http_server.py"))):
        if isinstance(node, ast.AsyncFunctionDef) and any(
                isinstance(d, ast.Call) and d.args and getattr(d.args[0], "value", None) == route
                for d in node.decorator_list):
            return ast.unparse(node.args.args[0].annotation).removeprefix("Annotated[").split(",")[0]
    raise AssertionError(f"no route {route} in sglang {SGLANG}")


def _update_output(wheel) -> set[str]:
    """The keys of SGLang's answer to both LoRA routes: the fields of LoRAUpdateOutput, which they return."""
    source = _source(wheel, IO_STRUCT)
    assert "LoadLoRAAdapterReqOutput = UnloadLoRAAdapterReqOutput = (" in source
    return set(_class_fields(wheel, IO_STRUCT, "LoRAUpdateOutput"))


async def _client_calls() -> tuple[list[tuple[str, dict]], list[str]]:
    """Every LoRA request SGLangEngine makes, answered as SGLang answers them; and the errors it raised."""
    calls, errors = [], []

    async def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else {}
        calls.append((request.url.path, body))
        if request.url.path == "/unload_lora_adapter":  # SGLang's registry does not know the name
            return httpx.Response(400, json={"success": False, "loaded_adapters": None, "error_message":
                                             f"LoRA with name {body['lora_name']} does not exist. Loaded LoRAs: "
                                             f"odict_keys([])"})
        if request.url.path == "/load_lora_adapter":
            return httpx.Response(200, json={"success": True, "error_message": "",
                                             "loaded_adapters": {body["lora_name"]: body["lora_path"]}})
        if request.url.path == "/generate":
            n = body["sampling_params"]["max_new_tokens"]
            return httpx.Response(200, json={"text": "", "output_ids": [9] * n, "meta_info": {
                "id": body["rid"], "finish_reason": {"type": "length", "length": n}, "weight_version": "default",
                "output_token_logprobs": [[-0.5, 9, None]] * n}})
        return httpx.Response(200)

    eng = SGLangEngine([URL], EngineConfig(backend="sglang", urls=[URL], health_timeout_s=1.0),
                       transport=httpx.MockTransport(answer))
    assert await eng.load_lora_adapter("policy-v3", "/run/weights/lora_3") == [{"policy-v3": "/run/weights/lora_3"}]
    eng.set_lora_adapter("policy-v3", 3)
    gen = await eng.generate([1, 2, 3], SamplingParams(max_new_tokens=2))
    assert gen.weight_versions == [3, 3]  # SGLang says "default" for an adapter's tokens; the client knows better
    await eng.unload_lora_adapter("policy-v2", missing_ok=True)
    try:
        await eng.unload_lora_adapter("policy-v2")
    except EngineError as e:
        errors.append(str(e))
    await eng.close()
    return calls, errors


async def test_client_lora_bodies_fit_sglangs_classes(wheel):
    calls, errors = await _client_calls()
    checked = set()
    for path, body in calls:
        if path not in ("/load_lora_adapter", "/unload_lora_adapter"):
            continue
        fields = _class_fields(wheel, IO_STRUCT, _route_class(wheel, path))
        assert set(body) <= set(fields) and {f for f, required in fields.items() if required} <= set(body)
        assert all(isinstance(v, str) for v in body.values())
        checked.add(path)
    assert checked == {"/load_lora_adapter", "/unload_lora_adapter"}
    assert _route_class(wheel, "/load_lora_adapter") == "LoadLoRAAdapterReqInput"
    generate = next(body for path, body in calls if path == "/generate")
    assert generate["lora_path"] == "policy-v3"
    assert "lora_path" in _class_fields(wheel, IO_STRUCT, "GenerateReqInput")
    assert "lora_path" in _class_fields(wheel, "sglang/api/v1/api_types.py", "GenerateRequest")
    # missing_ok relies on SGLang's wording for a name it does not hold (srt/lora/lora_registry.py)
    assert "does not exist. Loaded LoRAs:" in _source(wheel, "sglang/srt/lora/lora_registry.py")
    assert len(errors) == 1 and "LoRA with name policy-v2 does not exist" in errors[0] and URL in errors[0]


async def test_serve_answers_as_sglang_and_takes_its_whole_request(wheel, tiny_model_dir, tmp_path):
    peft_lora_model(tiny_model_dir, seed=1).save_pretrained(tmp_path / "lora")
    engine = LocalEngine.from_pretrained(tiny_model_dir, EngineConfig(max_batch_size=2, max_model_len=32))
    app = create_app(engine, str(tiny_model_dir), lora=LoraOptions())
    keys = _update_output(wheel)
    full = {f: None for f in _class_fields(wheel, IO_STRUCT, "LoadLoRAAdapterReqInput")} | {
        "lora_name": "a", "lora_path": str(tmp_path / "lora"), "pinned": False}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://serve") as http:
        answers = [await http.post("/load_lora_adapter", json=full),
                   await http.post("/load_lora_adapter", json=full),  # already loaded: refused
                   await http.post("/unload_lora_adapter", json={"lora_name": "a", "lora_id": None}),
                   await http.post("/unload_lora_adapter", json={"lora_name": "a"})]
        assert [r.status_code for r in answers] == [200, 400, 200, 400]
        assert all(set(r.json()) == keys for r in answers)
        assert (await http.post("/generate", json={"input_ids": [1, 2], "lora_path": None, "lora_id": None,
                                                   "sampling_params": {"max_new_tokens": 1}})).status_code == 200
    app.state.server.lora.close_sync()
    engine.close_sync()
    assert "because it is already loaded" in _source(wheel, "sglang/srt/lora/lora_manager.py")
    assert answers[1].json()["error_message"].startswith("Failed to load LoRA adapter a because it is already loaded")


def test_launch_flags_are_sglangs(wheel):
    """`launch-sglang --lora-rank` passes flags SGLang's server arguments define, with module names it accepts."""
    args = lora_launch_args(16, ["q_proj", "v_proj", "down_proj"])
    fields = ast.parse(_source(wheel, "sglang/srt/arg_groups/fields/lora.py"))
    lora = next(n for n in fields.body if isinstance(n, ast.ClassDef) and n.name == "Lora")
    flags = {"--" + s.target.id.replace("_", "-") for s in lora.body if isinstance(s, ast.AnnAssign)}
    assert {a for a in args if a.startswith("--")} <= flags
    common = ast.parse(_source(wheel, "sglang/srt/utils/common.py"))
    choices = next(ast.literal_eval(n.value) for n in common.body if isinstance(n, ast.Assign)
                   and getattr(n.targets[0], "id", None) == "SUPPORTED_LORA_TARGET_MODULES")
    modules = args[args.index("--lora-target-modules") + 1:args.index("--max-loras-per-batch")]
    assert modules == ["q_proj", "v_proj", "down_proj"] and set(modules) <= set(choices)
    assert "all" in lora_launch_args(8, "all-linear")  # peft's all-linear is SGLang's LORA_TARGET_ALL_MODULES
    assert 'LORA_TARGET_ALL_MODULES = "all"' in _source(wheel, "sglang/srt/utils/common.py")
