"""SGLang's wire format checked against SGLang itself, not only against `agentrl engine serve` (which shares
agentrl/inference/wire.py with the client, so a misreading of SGLang would pass both).

The reference is the sglang==SGLANG_VERSION wheel that `make setup` downloads (pip download --no-deps) into
$VENV/share/sglang-wire. Its sources are read from the zip; sglang is never installed or imported (importing it
pulls torch, zmq and the CUDA-era scheduler):
- sglang/api/v1/api_types.py, SGLang's generated HTTP JSON contract (GenerateRequest, SamplingParams,
  GenerateResponse, GenerateMetaInfo, AbortRequest), imports only msgspec and is run as is: SGLang's server runs
  `GenerateRequest.from_json_value` on every /generate body (entrypoints/api_contract.py).
- srt/managers/io_struct.py (GenerateReqInput and the request class of each control route) and
  srt/sampling/sampling_params.py (SamplingParams): fields, annotations and defaults read with `ast`; the control
  bodies are validated with pydantic as FastAPI parses them there (msgspec_struct_pydantic_core_schema: a typed
  dict, extra keys ignored, which is why every key is also checked to be a field).
- srt/entrypoints/http_server.py: which class each route parses and the keys of the JSON it answers (the dict
  literals in the route's function); srt/managers/tokenizer_manager.py and srt/utils/weight_versions.py: the
  meta_info keys SGLang's Python server writes. weight_versions.py's functions are run (its one sglang import, a
  pydantic hook its functions do not call, is left out) to build the spans SGLang reports.
- srt/weight_sync/tensor_bucket.py (FlattenedTensorBucket, torch only) is run as is: the weight broadcast's
  buckets must be its bytes, and the bodies of the three weight-broadcast routes must fit their request classes.
"""

from __future__ import annotations

import ast
import json
import os
import re
import sys
import types
import typing
import zipfile
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
import torch
import typing_extensions
from pydantic import TypeAdapter

from agentrl.inference import EngineConfig
from agentrl.inference.local import LocalEngine
from agentrl.inference.server import _IGNORED, _READ, create_app
from agentrl.inference.sglang import SGLangEngine
from agentrl.inference.weight_broadcast import (
    GROUP_NAME,
    TensorSpec,
    bucket_body,
    init_group_body,
    pack,
    specs_from_request,
    unpack,
)
from agentrl.inference.wire import generation_from_wire, version_from_label
from agentrl.types import SamplingParams

msgspec = pytest.importorskip("msgspec", reason="msgspec (a dev dependency, `make setup`) loads SGLang's API types")

SGLANG_VERSION = "0.5.23"  # the Makefile's SGLANG_WIRE (test_the_pinned_version_is_the_one_make_setup_fetches)
URL = "http://sglang:30000"
ROOT = Path(__file__).resolve().parents[3]

# Keys agentrl engine serve answers that SGLang does not, on purpose. SGLangEngine reads none of them (it only
# refuses an answer with "success": false), as the fake SGLang server below, which answers SGLang's keys, shows.
EXTRAS = {
    "/abort_request": {"success", "aborted"},  # SGLang: an empty body; "aborted" (0 or 1) is read by tests only
    "/flush_cache": {"success", "message"},  # SGLang: a text/plain body
}


class SGLangSource:
    """One sglang wheel's sources, read from the zip."""

    def __init__(self, wheel: Path):
        self.wheel = wheel
        self.zip = zipfile.ZipFile(wheel)
        self.api = self._module("sglang/api/v1/api_types.py")
        self.weight_versions = self._module("sglang/srt/utils/weight_versions.py", drop_sglang_imports=True)

    def tree(self, path: str) -> ast.Module:
        return ast.parse(self.zip.read(path).decode())

    def _module(self, path: str, drop_sglang_imports: bool = False) -> types.ModuleType:
        tree = self.tree(path)
        if drop_sglang_imports:
            tree.body = [n for n in tree.body if not (isinstance(n, ast.ImportFrom) and n.module.startswith("sglang"))]
        name = f"sglang_{SGLANG_VERSION.replace('.', '_')}_" + path.replace("/", "_").removesuffix(".py")
        module = types.ModuleType(name)
        sys.modules[name] = module  # msgspec resolves the Structs' annotations through sys.modules
        exec(compile(tree, f"{self.wheel}/{path}", "exec"), module.__dict__)
        return module

    def fields(self, path: str, cls: str) -> dict[str, tuple[str, object]]:
        """name -> (annotation source, default or `REQUIRED`) of a class in `path`, its bases in the file first."""
        classes = {n.name: n for n in self.tree(path).body if isinstance(n, ast.ClassDef)}
        out: dict[str, tuple[str, object]] = {}
        for base in classes[cls].bases:
            if isinstance(base, ast.Name) and base.id in classes:
                out.update(self.fields(path, base.id))
        for stmt in classes[cls].body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                out[stmt.target.id] = (ast.unparse(stmt.annotation), _default(stmt.value))
        return out

    def route(self, path: str) -> ast.AsyncFunctionDef:
        for node in ast.walk(self.tree("sglang/srt/entrypoints/http_server.py")):
            if isinstance(node, ast.AsyncFunctionDef) and any(
                    isinstance(d, ast.Call) and d.args and isinstance(d.args[0], ast.Constant)
                    and d.args[0].value == path for d in node.decorator_list):
                return node
        raise AssertionError(f"sglang {SGLANG_VERSION} http_server.py has no route {path}")

    def route_request_class(self, path: str) -> str:
        """The class SGLang parses the route's body into: `obj: Annotated[Cls, Body()]` (or `obj: Cls`)."""
        annotation = self.route(path).args.args[0].annotation
        if isinstance(annotation, ast.Subscript):  # Annotated[Cls, Body()]
            annotation = annotation.slice.elts[0]
        return annotation.id

    def route_answer_keys(self, path: str) -> set[str]:
        """Keys of the JSON objects the route's function writes (none: it answers an empty or a text body)."""
        return {k.value for node in ast.walk(self.route(path)) if isinstance(node, ast.Dict)
                for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}

    def meta_info_keys_written(self) -> set[str]:
        """`meta_info["k"] = ...`, `meta_info = {"k": ...}` and `meta_info.update({"k": ...})` in SGLang's
        tokenizer manager and weight_versions.py."""
        keys = set()
        for path in ("sglang/srt/managers/tokenizer_manager.py", "sglang/srt/utils/weight_versions.py"):
            for node in ast.walk(self.tree(path)):
                if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store) and _is_meta(node.value) \
                        and isinstance(node.slice, ast.Constant):
                    keys.add(node.slice.value)
                dicts = []
                if isinstance(node, ast.Assign) and any(_is_meta(t) for t in node.targets):
                    dicts = [node.value]
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "update" \
                        and _is_meta(node.func.value):
                    dicts = node.args
                keys |= {k.value for d in dicts if isinstance(d, ast.Dict) for k in d.keys
                         if isinstance(k, ast.Constant)}
        return keys


REQUIRED = object()


def _default(value: ast.expr | None) -> object:
    if value is None:
        return REQUIRED
    if isinstance(value, ast.Call) and ast.unparse(value.func) == "field":  # dataclasses.field(default=...)
        value = next((kw.value for kw in value.keywords if kw.arg == "default"), None)
        return REQUIRED if value is None else _default(value)
    try:
        return ast.literal_eval(value)
    except ValueError:
        return None  # a name defined elsewhere (e.g. TOP_K_ALL): not used below


def _names(struct: type) -> set[str]:
    return {f.name for f in msgspec.structs.fields(struct)}


def _is_meta(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "meta_info"


def _validator(fields: dict[str, tuple[str, object]]):
    """A pydantic validator of a JSON body by the fields' annotations; names SGLang defines elsewhere are Any."""
    names = {k: getattr(typing, k) for k in ("Any", "Dict", "List", "Literal", "Optional", "Union")}
    spec = {}
    for name, (annotation, default) in fields.items():
        try:
            hint = eval(annotation, names)  # noqa: S307 - an annotation from SGLang's source
        except NameError:
            hint = typing.Any
        spec[name] = typing_extensions.Required[hint] if default is REQUIRED else typing_extensions.NotRequired[hint]
    return TypeAdapter(typing_extensions.TypedDict("Body", spec))  # pydantic needs this TypedDict on Python 3.11


@pytest.fixture(scope="module")
def sgl():
    wheel = os.environ.get("AGENTRL_SGLANG_WHEEL")
    if wheel:
        assert Path(wheel).is_file(), f"AGENTRL_SGLANG_WHEEL={wheel} is not a file"
    else:
        found = sorted((Path(sys.prefix) / "share" / "sglang-wire").glob(f"sglang-{SGLANG_VERSION}-*.whl"))
        if not found:
            pytest.skip(f"the sglang=={SGLANG_VERSION} wheel is not in {sys.prefix}/share/sglang-wire: `make setup` "
                        f"downloads it (was the package registry unreachable?); AGENTRL_SGLANG_WHEEL=path names one")
        wheel = found[0]
    source = SGLangSource(Path(wheel))
    yield source
    source.zip.close()


class FakeSGLang:
    """Answers like sglang 0.5.23's http_server.py (shapes checked against it below) and records each request."""

    def __init__(self, sgl: SGLangSource):
        self.sgl = sgl
        self.calls: list[tuple[str, dict]] = []

    def generate_answer(self, body: dict) -> dict:
        """A /generate answer through SGLang's own code: the versions changed from "2" to "3" after 3 tokens."""
        api, wv = self.sgl.api, self.sgl.weight_versions
        n = body["sampling_params"]["max_new_tokens"]
        ids = list(range(40, 40 + n))
        req = SimpleNamespace(output_ids=ids[:3], weight_version_events=[])
        wv.record_weight_version_events([req], old_version="2")
        meta = api.GenerateMetaInfo(
            id=body["rid"], prompt_tokens=len(body["input_ids"]), completion_tokens=n, cached_tokens=1,
            e2e_latency=0.1, finish_reason=api.FinishLength(length=n), weight_version="3",
            output_token_logprobs=[api.LogprobEntry(logprob=-0.25, token_id=t) for t in ids]).to_json_value()
        spans = wv.compute_weight_version_spans(req.weight_version_events, current_version="3", num_output_tokens=n)
        wv.add_weight_versions_to_meta_info(meta, spans, num_output_tokens=n)
        return api.GenerateResponse(text="", output_ids=ids).to_json_value() | {"meta_info": meta}

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else {}
        self.calls.append((request.url.path, body))
        path = request.url.path
        if path == "/generate":
            return httpx.Response(200, json=self.generate_answer(body))
        if path == "/update_weights_from_disk":
            return httpx.Response(200, json={"success": True, "message": "Succeeded.", "num_paused_requests": 0})
        if path in ("/pause_generation", "/continue_generation"):
            return httpx.Response(200, json={"message": f"{path} succeeded.", "status": "ok"})
        if path == "/flush_cache":
            return httpx.Response(200, text="Cache flushed.\n")
        return httpx.Response(200)  # /health, /abort_request, /release_memory_occupation: no JSON object


async def _client_against_fake(sgl: SGLangSource) -> FakeSGLang:
    """Every request SGLangEngine makes, with every sampling value it can send set."""
    fake = FakeSGLang(sgl)
    eng = SGLangEngine([URL], EngineConfig(backend="sglang", urls=[URL], health_timeout_s=1.0),
                       transport=httpx.MockTransport(fake))
    await eng.generate([1, 2, 3], SamplingParams(max_new_tokens=5, temperature=0.7, top_p=0.9, top_k=20,
                                                 stop=["</answer>"], stop_token_ids=[5], seed=11, ignore_eos=True,
                                                 min_new_tokens=2), request_id="ep1-turn0")
    await eng.generate([1, 2, 3], SamplingParams(max_new_tokens=4))
    await eng.pause_generation("abort")
    await eng.pause_generation("retract")
    await eng.pause_generation("in_place")
    await eng.update_weights("/ckpt/step-3", version=3, abort_in_flight=True)
    await eng.update_weights("/ckpt/step-4")
    await eng.continue_generation()
    await eng.abort("ep1-turn0")
    await eng.abort_all()
    await eng.flush_cache()
    await eng.release_memory_occupation(["kv_cache"])
    await eng.resume_memory_occupation()
    await eng.close()
    return fake


def test_the_pinned_version_is_the_one_make_setup_fetches(sgl):
    assert re.search(rf"^SGLANG_WIRE := {re.escape(SGLANG_VERSION)}$", (ROOT / "Makefile").read_text(), re.M)
    assert f"sglang-{SGLANG_VERSION}.dist-info/METADATA" in sgl.zip.namelist()


async def test_client_generate_bodies_pass_sglangs_contract(sgl):
    fake = await _client_against_fake(sgl)
    bodies = [b for path, b in fake.calls if path == "/generate"]
    request_fields = set(sgl.fields("sglang/srt/managers/io_struct.py", "GenerateReqInput"))
    sampling_fields = set(sgl.fields("sglang/srt/sampling/sampling_params.py", "SamplingParams"))
    api_request = _names(sgl.api.GenerateRequest)
    api_sampling = _names(sgl.api.SamplingParams)
    assert len(bodies) == 2
    for body in bodies:
        decoded = sgl.api.GenerateRequest.from_json_value(body)  # raises as SGLang's 400 would
        assert set(body) <= api_request & request_fields  # the contract ignores unknown keys: none may be unknown
        assert set(body["sampling_params"]) <= api_sampling & sampling_fields
        assert decoded.input_ids == [1, 2, 3] and decoded.return_logprob is True and decoded.stream is False
    seeded = sgl.api.GenerateRequest.from_json_value(bodies[0]).sampling_params
    assert (seeded.sampling_seed, seeded.top_k, seeded.stop, seeded.ignore_eos, seeded.min_new_tokens) == (
        11, 20, ["</answer>"], True, 2)
    assert seeded.no_stop_trim is True and seeded.skip_special_tokens is False  # the token-exact settings


async def test_client_control_bodies_fit_sglangs_request_classes(sgl):
    fake = await _client_against_fake(sgl)
    checked = set()
    for path, body in fake.calls:
        if path in ("/generate", "/health", "/flush_cache"):  # /flush_cache takes no body (a query parameter)
            continue
        fields = sgl.fields("sglang/srt/managers/io_struct.py", sgl.route_request_class(path))
        assert set(body) <= set(fields), (path, set(body) - set(fields))
        _validator(fields).validate_python(body, strict=True)
        checked.add(path)
    assert checked == {"/update_weights_from_disk", "/pause_generation", "/continue_generation", "/abort_request",
                       "/release_memory_occupation", "/resume_memory_occupation"}
    for body in [b for path, b in fake.calls if path == "/abort_request"]:
        sgl.api.AbortRequest.from_json_value(body)
    update = next(b for path, b in fake.calls if path == "/update_weights_from_disk")
    assert update == {"model_path": "/ckpt/step-3", "abort_all_requests": True, "flush_cache": True,
                      "weight_version": "3"}


async def test_client_reads_sglangs_answers_and_the_version_of_each_token(sgl):
    fake_keys = {"/update_weights_from_disk": {"success", "message", "num_paused_requests"},
                 "/pause_generation": {"message", "status"}, "/continue_generation": {"message", "status"},
                 "/abort_request": set(), "/flush_cache": set()}
    assert {path: sgl.route_answer_keys(path) for path in fake_keys} == fake_keys  # the fake answers as SGLang
    fake = FakeSGLang(sgl)
    eng = SGLangEngine([URL], EngineConfig(backend="sglang", urls=[URL], health_timeout_s=1.0),
                       transport=httpx.MockTransport(fake))
    g = await eng.generate([1, 2, 3], SamplingParams(max_new_tokens=5))
    await eng.close()
    assert g.token_ids == [40, 41, 42, 43, 44] and g.logprobs == [-0.25] * 5 and g.finish_reason == "length"
    assert g.weight_versions == [2, 2, 2, 3, 3]  # SGLang's spans, not its one label for the whole request
    assert g.metrics["weight_version"] == "3" and g.metrics["cached_tokens"] == 1

    answer = fake.generate_answer({"rid": "r", "input_ids": [1], "sampling_params": {"max_new_tokens": 4}})
    del answer["meta_info"]["weight_versions"]  # as older releases answer
    assert generation_from_wire(answer).weight_versions == [3, 3, 3, 3]  # the request's label stands for each


async def test_client_reads_only_keys_sglang_writes(sgl):
    class Reads(dict):
        def __init__(self, d: dict):
            super().__init__(d)
            self.read: set[str] = set()

        def __getitem__(self, key):
            self.read.add(key)
            return super().__getitem__(key)

        def get(self, key, default=None):
            self.read.add(key)
            return super().get(key, default)

        def __contains__(self, key):
            self.read.add(key)
            return super().__contains__(key)

    answer = FakeSGLang(sgl).generate_answer({"rid": "r", "input_ids": [1], "sampling_params": {"max_new_tokens": 4}})
    top, meta = Reads(answer), Reads(answer["meta_info"])
    top["meta_info"] = meta
    generation_from_wire(top)
    assert top.read <= _names(sgl.api.GenerateResponse)
    assert meta.read <= _names(sgl.api.GenerateMetaInfo)
    assert meta.read <= sgl.meta_info_keys_written()  # the Python server writes them too, not only the contract
    assert {"output_token_logprobs", "finish_reason", "weight_version", "weight_versions"} <= meta.read


# ---------------------------------------------------------------- agentrl engine serve against SGLang


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    eng = LocalEngine.from_pretrained(tiny_model_dir, EngineConfig(max_batch_size=4, max_model_len=64))
    yield eng
    eng.close_sync()


@pytest.fixture
async def serve(engine, tiny_model_dir):
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(engine, str(tiny_model_dir))),
                                 base_url="http://serve") as http:
        yield http


async def test_serve_generate_answers_decode_with_sglangs_contract(sgl, serve):
    finish_fields = {"type"} | _names(sgl.api.FinishStop) | _names(sgl.api.FinishLength) | _names(
        sgl.api.FinishAbort)
    first = (await serve.post("/generate", json={"input_ids": [5, 6, 7], "return_logprob": True,
                                                 "sampling_params": {"max_new_tokens": 3, "temperature": 0}})).json()
    answers = [first]
    for body in ({"input_ids": [[5, 6], [7]], "sampling_params": {"max_new_tokens": 2, "temperature": 0},
                  "return_logprob": True, "return_text_in_logprobs": True},
                 {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 3, "temperature": 0,
                                                              "stop_token_ids": first["output_ids"][1:2]}},
                 {"text": "hello", "sampling_params": {"max_new_tokens": 2, "temperature": 0, "stop": ["e"]}}):
        r = await serve.post("/generate", json=body)
        assert r.status_code == 200, r.text
        answers += r.json() if isinstance(r.json(), list) else [r.json()]
    assert answers[3]["meta_info"]["finish_reason"] == {"type": "stop", "matched": first["output_ids"][1]}
    for answer in answers:
        decoded = sgl.api.GenerateResponse.from_json_value(answer)
        assert set(answer) <= _names(sgl.api.GenerateResponse)
        assert set(answer["meta_info"]) <= _names(sgl.api.GenerateMetaInfo)  # no agentrl-only meta_info keys
        assert set(answer["meta_info"]["finish_reason"]) <= finish_fields
        n = len(answer["output_ids"])
        assert [(s.version, s.start, s.end) for s in decoded.meta_info.weight_versions] == [(
            decoded.meta_info.weight_version, 0, n)]
    label = first["meta_info"]["weight_version"]  # "default" unless the update test ran first
    assert generation_from_wire(first).weight_versions == [version_from_label(label)] * 3


async def test_serve_accepts_every_sglang_generate_field_at_its_default(sgl, serve):
    def defaults(cls) -> dict:
        return {f.name: f.default_factory() if f.default is msgspec.NODEFAULT else f.default
                for f in msgspec.structs.fields(cls)}

    dataclass = {k: v for k, (_, v) in sgl.fields("sglang/srt/managers/io_struct.py", "GenerateReqInput").items()}
    assert REQUIRED not in dataclass.values()
    body = dataclass | defaults(sgl.api.GenerateRequest) | {
        "input_ids": [5, 6, 7], "return_logprob": True,
        "sampling_params": defaults(sgl.api.SamplingParams) | {"max_new_tokens": 2, "ignore_eos": True}}
    sgl.api.GenerateRequest.from_json_value(body)  # a body real SGLang admits
    r = await serve.post("/generate", json=body)
    assert r.status_code == 200, r.text
    assert len(r.json()["output_ids"]) == 2
    assert _READ | _IGNORED <= set(dataclass)  # every field the server names is SGLang's
    hints = {"session_id": "s", "priority": 3, "routing_key": "k", "custom_labels": {"team": "rl"}, "extra_key": "x",
             "cache_salt": "x", "log_metrics": False, "no_logs": True, "routed_dp_rank": 1}
    assert set(hints) <= _IGNORED
    r = await serve.post("/generate", json={"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 1}} | hints)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("extra, named", [
    ({"lora_path": "adapters/a"}, "lora_path"),
    ({"return_hidden_states": True}, "return_hidden_states"),
    ({"image_data": "cat.png"}, "image_data"),
    ({"return_logprobs": True}, "return_logprobs"),  # not SGLang's (return_logprob): refused rather than ignored
    ({"sampling_params": {"max_new_tokens": 1, "beam_width": 4}}, "beam_width"),
    ({"sampling_params": {"max_new_tokens": 1, "logit_bias": {"5": 2.0}}}, "logit_bias"),
])
async def test_serve_refuses_what_it_cannot_honour_by_name(serve, extra, named):
    r = await serve.post("/generate", json={"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 1}} | extra)
    assert r.status_code == 400 and named in r.json()["error"]["message"]


async def test_serve_control_answers_use_sglangs_keys(sgl, serve, tiny_model_dir):
    fields = sgl.fields("sglang/srt/managers/io_struct.py", "UpdateWeightFromDiskReqInput")
    update = {k: v for k, (_, v) in fields.items() if v is not REQUIRED} | {
        "model_path": str(tiny_model_dir), "weight_version": "7"}  # every field SGLang takes, at its default
    answers = {"/update_weights_from_disk": await serve.post("/update_weights_from_disk", json=update),
               "/pause_generation": await serve.post("/pause_generation", json={"mode": "in_place"})}
    answers["/continue_generation"] = await serve.post("/continue_generation", json={"torch_empty_cache": True})
    answers["/abort_request"] = await serve.post("/abort_request", json={"rid": "nobody"})
    answers["/flush_cache"] = await serve.post("/flush_cache")
    for path, r in answers.items():
        assert r.status_code == 200, (path, r.text)
        assert set(r.json()) <= sgl.route_answer_keys(path) | EXTRAS.get(path, set()), path
    assert set(answers["/pause_generation"].json()) == {"message", "status"}
    failed = await serve.post("/update_weights_from_disk", json={"model_path": str(tiny_model_dir / "missing")})
    assert failed.status_code == 400 and set(failed.json()) <= sgl.route_answer_keys("/update_weights_from_disk")
    assert failed.json()["success"] is False
    r = await serve.post("/generate", json={"input_ids": [5], "sampling_params": {"max_new_tokens": 1}})
    assert r.json()["meta_info"]["weight_version"] == "7"


# ---------------------------------------------------------------- weight broadcast (both ends) against SGLang

BROADCAST_ROUTES = {"/init_weights_update_group": "InitWeightsUpdateGroupReqInput",
                    "/update_weights_from_distributed": "UpdateWeightsFromDistributedReqInput",
                    "/destroy_weights_update_group": "DestroyWeightsUpdateGroupReqInput"}


def test_broadcast_bodies_fit_sglangs_request_classes(sgl):
    specs = [TensorSpec("model.embed_tokens.weight", "float32", (16, 8)), TensorSpec("h", "bfloat16", (3,))]
    bodies = {"/init_weights_update_group": init_group_body("10.0.0.5", 29500, rank_offset=1, world_size=3,
                                                            backend="nccl"),
              "/update_weights_from_distributed": bucket_body(specs, weight_version="4", abort_all_requests=True),
              "/destroy_weights_update_group": {"group_name": GROUP_NAME}}
    for path, cls in BROADCAST_ROUTES.items():
        assert sgl.route_request_class(path) == cls
        fields = sgl.fields("sglang/srt/managers/io_struct.py", cls)
        assert set(bodies[path]) <= set(fields), (path, set(bodies[path]) - set(fields))
        _validator(fields).validate_python(bodies[path], strict=True)
        assert sgl.route_answer_keys(path) == {"success", "message"}
    assert "flattened_bucket" in sgl.zip.read(
        "sglang/srt/model_executor/model_runner_components/weight_updater.py").decode()  # the load format we send


def test_packed_buckets_are_sglangs_flattened_tensor_bucket(sgl):
    module = sgl._module("sglang/srt/weight_sync/tensor_bucket.py")  # imports torch and dataclasses only
    tensors = [("w", torch.randn(3, 4)), ("i", torch.arange(6)), ("h", torch.randn(5).to(torch.bfloat16))]
    theirs = module.FlattenedTensorBucket(named_tensors=tensors).get_flattened_tensor()
    assert torch.equal(pack([t for _, t in tensors]), theirs)  # what the trainer sends, byte for byte
    specs = [TensorSpec.of(name, t) for name, t in tensors]
    body = bucket_body(specs)
    received = module.FlattenedTensorBucket.empty(body["names"], body["dtypes"], body["shapes"], "cpu")
    received.get_flattened_tensor().copy_(theirs)  # what SGLang's receiver rebuilds from our body
    assert [(n, t.dtype, tuple(t.shape)) for n, t in received.reconstruct_tensors()] == [
        (n, t.dtype, tuple(t.shape)) for n, t in tensors]
    ours = unpack(theirs, specs_from_request(body))  # and engine serve reads SGLang's bytes alike
    assert all(torch.equal(a, t) for (_, a), (_, t) in zip(ours, tensors))


async def test_serve_broadcast_answers_use_sglangs_keys(sgl, serve):
    defaults = {name: {k: v for k, (_, v) in sgl.fields("sglang/srt/managers/io_struct.py", cls).items()
                       if v is not REQUIRED} for name, cls in BROADCAST_ROUTES.items()}
    answers = [await serve.post("/init_weights_update_group", json=defaults["/init_weights_update_group"] | {
                   "master_address": "127.0.0.1", "master_port": 1, "rank_offset": 1, "world_size": 2}),  # nccl
               await serve.post("/update_weights_from_distributed", json=defaults["/update_weights_from_distributed"]
                                | {"names": ["model.norm.weight"], "dtypes": ["float32"], "shapes": [[128]]}),
               await serve.post("/destroy_weights_update_group", json=defaults["/destroy_weights_update_group"])]
    for r, named in zip(answers, ("send backend \"gloo\"", "Please call `init_weights_update_group` first",
                                  "does not exist")):
        assert r.status_code == 400 and r.json()["success"] is False and named in r.json()["message"]
        assert set(r.json()) == {"success", "message"}
