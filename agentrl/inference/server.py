"""`agentrl engine serve`: a LocalEngine behind SGLang's native HTTP API.

The routes and JSON shapes follow sglang 0.5.x (`/generate`, `/update_weights_from_disk`, `/flush_cache`,
`/abort_request`, `/pause_generation`, `/continue_generation`, `/health`, `/health_generate`, `/get_model_info`,
`/get_server_info`), so `SGLangEngine` and other SGLang clients work against it unchanged and the SGLang code
path is exercised end to end on CPU.

Weight versions: `/update_weights_from_disk` takes SGLang's `weight_version` label (default: the engine's update
count); every /generate answer's `meta_info.weight_version` is the label of the weights that sampled its last
token and `meta_info.weight_versions` SGLang's spans of output tokens sampled under each label. `/pause_generation`
with mode "abort" returns requests in flight now (finish_reason abort, tokens so far); "retract" and "in_place"
hold them; requests sent while paused wait for `/continue_generation`. Rows still in flight when new weights
load are re-prefilled under them (`LocalEngine.update_weights`, on_running="continue").
Every SGLang sampling parameter is honoured (`ignore_eos` and `min_new_tokens` included) or, where the local
engine cannot honour its value, rejected with HTTP 400 naming the field (`wire.sampling_params_from_wire`);
there is no prefix cache (`cached_tokens` is always 0) and no streaming. Top-level /generate fields beyond the
ones read here are ignored at SGLang's defaults (null, false, 0, empty) and refused by name otherwise, except
routing, caching and logging hints, which never change an answer (`_IGNORED`).

Weights over a process group (SGLang's `/init_weights_update_group`, `/update_weights_from_distributed`,
`/destroy_weights_update_group`, `agentrl.inference.weight_broadcast`): the server joins the trainer's group over
gloo and receives each bucket; the new weights go live together once every parameter of the model has arrived
(SGLang loads each bucket as it comes; the trainer pauses or idles the engine around an update either way), under
the weight_version of the update's last bucket. Buckets that name a tensor this model does not have, or end an
update with parameters missing, are refused by name and close the group.

Access: with a `token` (`--token-file`) every route but `GET /health` needs `Authorization: Bearer <token>`, as
SGLang's `--api-key` does (`agentrl.auth`). With a `weights_dir` (`--weights-dir`), `/update_weights_from_disk`
loads only from directories under it (symlinks and `..` resolved first) and answers 403 for any other path; it
is required beyond loopback, where anyone holding the token could otherwise make the server read any directory.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from agentrl.auth import BearerAuth, is_loopback
from agentrl.errors import UserError
from agentrl.inference.base import EngineError, PromptTooLongError
from agentrl.inference.local import LocalEngine
from agentrl.inference.weight_broadcast import (
    GROUP_NAME,
    TensorSpec,
    destroy_weight_group,
    empty_bucket,
    init_weight_group,
    specs_from_request,
    torch_dtype,
    unpack,
)
from agentrl.inference.wire import WireError, finish_reason_to_wire, sampling_params_from_wire, weight_version_spans

# /generate fields (sglang 0.5.23 `GenerateReqInput`) the server reads, and those it may ignore whatever their value
_READ = {"text", "input_ids", "sampling_params", "return_logprob", "logprob_start_len", "top_logprobs_num",
         "return_text_in_logprobs", "rid", "stream"}
_IGNORED = {"session_id", "log_metrics", "priority", "routed_dp_rank", "data_parallel_rank", "disagg_prefill_dp_rank",
            "routing_key", "conversation_id", "extra_key", "cache_salt", "kv_hints", "custom_labels", "no_logs",
            "external_trace_header", "received_time", "http_worker_ipc", "background"}


class WeightsDirError(UserError):
    """`--weights-dir` is missing where it is required, or is not a directory."""


def check_weights_dir(weights_dir: str | None, host: str) -> Path | None:
    """The resolved `--weights-dir` (None: no restriction, allowed on loopback only)."""
    if weights_dir is None:
        if not is_loopback(host):
            raise WeightsDirError(f"agentrl engine serve on host {host} needs --weights-dir DIR (e.g. RUN_DIR/weights, "
                                  f"where the trainer saves weights): /update_weights_from_disk then loads only from "
                                  f"under DIR")
        return None
    path = Path(weights_dir).expanduser().resolve()
    if not path.is_dir():
        raise WeightsDirError(f"--weights-dir {weights_dir}: {path} is not a directory; create it or fix the path")
    return path


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message}}, status_code=status)


def _per_item(value: Any, n: int, name: str, batched: bool) -> list:
    """Broadcast a scalar/object field over a batch, or check a per-item list has the batch's length."""
    if batched and isinstance(value, list):
        if len(value) != n:
            raise WireError(f"{name} has {len(value)} entries but the batch has {n} inputs")
        return value
    return [value] * n


class _Server:
    def __init__(self, engine: LocalEngine, model_path: str, weights_dir: Path | None = None,
                 group_timeout_s: float = 300.0):
        self.engine = engine
        self.model_path = model_path
        self.weights_dir = weights_dir
        self.weight_version = "default"
        self._labels = {engine.weight_version: self.weight_version}  # engine version -> weight_version label
        self._update_lock = asyncio.Lock()
        self.group_timeout_s = group_timeout_s
        self._groups: dict[str, Any] = {}  # weight-update process groups by name
        self._staged: dict[str, torch.Tensor] = {}  # received tensors waiting for the rest of the model
        self._staged_label: str | None = None
        own = engine.model.state_dict()  # names a complete update must bring (a tied lm_head comes with the embedding)
        tied = {"lm_head.weight"} if getattr(engine.model.config, "tie_word_embeddings", False) else set()
        self._required = set(own) - tied

    def label(self, version: int) -> str:
        return self._labels.get(version, str(version))

    def _inputs(self, body: dict) -> tuple[list[list[int]], bool]:
        has_ids, has_text = body.get("input_ids") is not None, body.get("text") is not None
        if has_ids == has_text:
            raise WireError("send exactly one of input_ids or text")
        if has_text:
            text = body["text"]
            batched = isinstance(text, list)
            texts = text if batched else [text]
            if not all(isinstance(t, str) for t in texts) or not texts:
                raise WireError("text must be a string or a non-empty list of strings")
            return [self.engine.tokenizer.encode(t) for t in texts], batched
        ids = body["input_ids"]
        if not isinstance(ids, list) or not ids:
            raise WireError("input_ids must be a non-empty list of token ids or a list of such lists")
        batched = isinstance(ids[0], list)
        seqs = ids if batched else [ids]
        for i, seq in enumerate(seqs):
            if not isinstance(seq, list) or not seq or not all(isinstance(t, int) and not isinstance(t, bool)
                                                               for t in seq):
                raise WireError(f"input_ids[{i}] must be a non-empty list of integers" if batched
                                else "input_ids must be a non-empty list of integers")
        return seqs, batched

    def _check_top_level(self, body: dict) -> None:
        """Fields set beyond `_READ` and `_IGNORED` (multimodal inputs, LoRA, extra outputs, ...) are refused."""
        refused = sorted(k for k, value in body.items() if value and k not in _READ | _IGNORED)
        if refused:
            raise WireError(f"/generate fields {refused} are not supported by agentrl engine serve (it reads "
                            f"{sorted(_READ)}); leave them out or use a real SGLang server")
        if body.get("stream"):
            raise WireError("stream=true is not supported by agentrl engine serve; send stream=false")
        if body.get("top_logprobs_num") not in (None, 0):
            raise WireError("top_logprobs_num > 0 is not supported by agentrl engine serve")

    async def generate(self, body: dict) -> Any:
        self._check_top_level(body)
        seqs, batched = self._inputs(body)
        n = len(seqs)
        sps = _per_item(body.get("sampling_params"), n, "sampling_params", batched)
        rets = _per_item(body.get("return_logprob", False), n, "return_logprob", batched)
        starts = _per_item(body.get("logprob_start_len", -1), n, "logprob_start_len", batched)
        rid = body.get("rid")
        rids = _per_item(rid, n, "rid", batched) if rid is not None else [uuid.uuid4().hex for _ in range(n)]
        for seq, start in zip(seqs, starts):
            if start is not None and start != -1 and start < len(seq):
                raise WireError(f"logprob_start_len={start} asks for prompt logprobs, which agentrl engine serve "
                                f"does not return; send -1")
        for i, seq in enumerate(seqs):  # validate the whole batch before any item starts decoding
            where = f"input {i}: " if batched else ""
            if len(seq) >= self.engine.max_model_len:
                raise PromptTooLongError(f"{where}prompt has {len(seq)} tokens but the context window "
                                         f"(max_model_len) is {self.engine.max_model_len}")
            bad = next((t for t in seq if not 0 <= t < self.engine.vocab_size), None)
            if bad is not None:
                raise WireError(f"{where}token id {bad} is outside the vocabulary [0, {self.engine.vocab_size})")
        parsed = [sampling_params_from_wire(sp, max_new_tokens_default=self.engine.max_model_len) for sp in sps]
        with_text = bool(body.get("return_text_in_logprobs", False))
        items = await asyncio.gather(*[self._one(seq, p, opts, bool(ret), str(r), with_text)
                                       for seq, (p, opts), ret, r in zip(seqs, parsed, rets, rids)])
        return items if batched else items[0]

    async def _one(self, ids: list[int], params, text_opts: dict, return_logprob: bool, rid: str,
                   with_text: bool) -> dict:
        t0 = time.perf_counter()
        gen = await self.engine.generate(ids, params, request_id=rid)
        tok = self.engine.tokenizer
        matched = gen.metrics.get("matched_stop")
        text_ids = gen.token_ids
        if gen.finish_reason == "stop" and not text_opts["no_stop_trim"] and isinstance(matched, int):
            text_ids = text_ids[:-1]
        text = tok.decode(text_ids, skip_special_tokens=text_opts["skip_special_tokens"],
                          spaces_between_special_tokens=text_opts["spaces_between_special_tokens"]) if tok else ""
        if gen.finish_reason == "stop" and not text_opts["no_stop_trim"] and isinstance(matched, str):
            text = text[:text.find(matched)] if matched in text else text
        meta = {
            "id": rid,
            "finish_reason": finish_reason_to_wire(gen.finish_reason, matched, len(gen.token_ids)),
            "prompt_tokens": len(ids),
            "completion_tokens": len(gen.token_ids),
            "cached_tokens": 0,
            "e2e_latency": time.perf_counter() - t0,
            "weight_version": self.label(gen.metrics["weight_version"]),
            "weight_versions": weight_version_spans([self.label(v) for v in gen.weight_versions],
                                                    self.label(gen.metrics["weight_version"])),
        }
        if return_logprob:
            meta["output_token_logprobs"] = [
                [lp, t, tok.decode([t], skip_special_tokens=False) if with_text and tok else None]
                for lp, t in zip(gen.logprobs, gen.token_ids)]
            meta["input_token_logprobs"] = []
        return {"text": text, "output_ids": gen.token_ids, "meta_info": meta}

    async def update_weights_from_disk(self, body: dict) -> JSONResponse:
        path = body.get("model_path")
        if not isinstance(path, str) or not path:
            return JSONResponse({"success": False, "message": "model_path (a HF model directory) is required"},
                                status_code=400)
        if self.weights_dir is not None:
            resolved = Path(path).resolve()
            if not resolved.is_relative_to(self.weights_dir):
                return JSONResponse({"success": False, "message": f"model_path {path} (resolved: {resolved}) is not "
                                     f"under this server's --weights-dir {self.weights_dir}: save the weights there"},
                                    status_code=403)
            path = str(resolved)  # load the path that was checked (links resolved), not the one sent
        if body.get("load_format") not in (None, "auto", "safetensors"):
            return JSONResponse({"success": False, "message": f"load_format={body['load_format']!r} is not "
                                 "supported by agentrl engine serve (auto or safetensors)"}, status_code=400)
        label = body.get("weight_version")
        if label is not None and not isinstance(label, str):
            return JSONResponse({"success": False, "message": f"weight_version must be a string label, got "
                                 f"{label!r}"}, status_code=400)
        abort = bool(body.get("abort_all_requests"))
        async with self._update_lock:
            if abort:
                self.engine.abort_all()
            try:
                await self._load(Path(path), label, abort)
            except (ValueError, OSError) as e:
                return JSONResponse({"success": False, "message": f"failed to load weights from {path}: {e}"},
                                    status_code=400)
        return JSONResponse({"success": True, "message": f"Succeeded to update model weights from {path}.",
                             "num_paused_requests": 0})

    async def _load(self, weights, label: str | None, abort: bool) -> None:
        """Swap in new weights (a directory or a state dict) labelled `label` (default: the update count).
        Call under the update lock."""
        version = self.engine.weight_version + 1
        self._labels[version] = label or str(version)  # before the swap: tokens sampled right after need it
        try:
            await self.engine.update_weights(weights, on_running="abort" if abort else "continue")
        except BaseException:
            del self._labels[version]
            raise
        self.weight_version = self._labels[version]

    # ------------------------------------------------------------------ weights over a process group

    async def init_weights_update_group(self, body: dict) -> JSONResponse:
        try:
            address, port = body["master_address"], body["master_port"]
            rank, world_size = body["rank_offset"], body["world_size"]
            name, backend = body.get("group_name", GROUP_NAME), body.get("backend", "nccl")
            if not (isinstance(address, str) and all(isinstance(v, int) for v in (port, rank, world_size))):
                raise TypeError
        except (KeyError, TypeError):
            return _failure(400, "send master_address (str), master_port, rank_offset and world_size (ints)")
        if backend != "gloo":
            return _failure(400, f"backend {backend!r}: agentrl engine serve runs on CPU and joins weight-update "
                                 "groups over gloo; send backend \"gloo\"")
        if name in self._groups:
            return _failure(400, f"group {name!r} exists; /destroy_weights_update_group it first")
        try:  # blocks until every rank joined (the trainer joins as rank 0 at the same time)
            self._groups[name] = await asyncio.to_thread(init_weight_group, address, port, rank=rank,
                                                         world_size=world_size, group_name=name, backend=backend,
                                                         timeout_s=self.group_timeout_s)
        except Exception as e:  # the rendezvous failed or timed out: torch's errors are several types
            return _failure(400, f"Failed to initialize custom process group: {e}.")
        return JSONResponse({"success": True, "message": "Succeeded to initialize custom process group."})

    async def destroy_weights_update_group(self, body: dict) -> JSONResponse:
        group = self._groups.pop(body.get("group_name", GROUP_NAME), None)
        if group is None:
            return _failure(400, "The group to be destroyed does not exist.")
        self._staged = {}
        await asyncio.to_thread(destroy_weight_group, group)
        return JSONResponse({"success": True, "message": "Succeeded to destroy custom process group."})

    async def update_weights_from_distributed(self, body: dict) -> JSONResponse:
        """Receive one broadcast bucket (or SGLang's default: one broadcast per tensor) and stage it; the new
        weights go live together once every parameter of the model has arrived, under the last call's
        weight_version. A call with a weight_version ends an update: parameters still missing then are an error
        (the trainer's model is not this one). A refused bucket drops the group: the trainer's broadcast cannot
        complete without this server."""
        name = body.get("group_name", GROUP_NAME)
        group = self._groups.get(name)
        if group is None:
            return _failure(400, f"Group {name} not in {sorted(self._groups)}. Please call "
                                 "`init_weights_update_group` first.")
        try:
            specs = specs_from_request(body)
            self._check_specs(specs)
            if body.get("load_format") not in (None, "flattened_bucket"):
                raise ValueError(f"load_format {body['load_format']!r} (agentrl engine serve receives None or "
                                 "flattened_bucket)")
            label = body.get("weight_version")
            if label is not None and not isinstance(label, str):
                raise ValueError(f"weight_version must be a string label, got {label!r}")
        except ValueError as e:
            await self.destroy_weights_update_group({"group_name": name})
            return _failure(400, f"refused the bucket ({e}); the group {name!r} is closed, open a new one")
        abort = bool(body.get("abort_all_requests"))
        if abort:
            self.engine.abort_all()
        try:
            received = await asyncio.to_thread(_receive, group, specs, body.get("load_format"))
        except Exception as e:  # the broadcast broke (the trainer died or timed out): the group is unusable
            await self.destroy_weights_update_group({"group_name": name})
            return _failure(400, f"Failed to receive the broadcast: {e}; the group {name!r} is closed")
        self._staged.update((k, v) for k, v in received.items() if k in self._required)  # not a tied lm_head
        if label is not None:
            self._staged_label = label
        missing = self._required - set(self._staged)
        if missing and label is not None:  # the sender's last bucket (it carries the label): nothing may be left out
            self._staged, self._staged_label = {}, None
            return _failure(400, f"Failed to update parameter online: the update ended (weight_version {label}) "
                                 f"without {len(missing)} parameters of this model, e.g. {sorted(missing)[:3]}; "
                                 "is the trainer's model the one this server serves?")
        if missing:
            return JSONResponse({"success": True, "message": f"Received {len(specs)} tensors; staged "
                                 f"{len(self._staged)}, {len(missing)} to go before the weights change."})
        staged, label = self._staged, self._staged_label
        self._staged, self._staged_label = {}, None
        async with self._update_lock:
            try:
                await self._load(staged, label, abort)
            except ValueError as e:
                return _failure(400, f"Failed to update parameter online: {e}")
        return JSONResponse({"success": True, "message": "Succeeded to update parameter online."
                             + (f" Weight version updated to {label}." if label else "")})

    def _check_specs(self, specs: list[TensorSpec]) -> None:
        own = self.engine.model.state_dict()
        for spec in specs:
            if spec.name not in own:
                raise ValueError(f"{spec.name} is not a parameter of this model")
            if tuple(own[spec.name].shape) != spec.shape:
                raise ValueError(f"{spec.name} has shape {list(spec.shape)}, the model's is "
                                 f"{list(own[spec.name].shape)}")


def _receive(group, specs: list[TensorSpec], load_format: str | None) -> dict:
    """The tensors of one broadcast from rank 0 of `group` (copies: the model loads them later)."""
    import torch.distributed as dist

    if load_format == "flattened_bucket":
        flat = empty_bucket(specs)
        dist.broadcast(flat, group_src=0, group=group)
        return dict(unpack(flat, specs))
    out = {}
    for spec in specs:
        out[spec.name] = torch.empty(spec.shape, dtype=torch_dtype(spec.dtype))
        dist.broadcast(out[spec.name], group_src=0, group=group)
    return out


def _failure(status: int, message: str) -> JSONResponse:
    return JSONResponse({"success": False, "message": message}, status_code=status)


def create_app(engine: LocalEngine, model_path: str, *, token: str | None = None,
               weights_dir: Path | None = None) -> FastAPI:
    """The FastAPI app; run it with uvicorn (see `agentrl.inference.cli`). `token`: the bearer token every route
    but /health requires (None: no check); `weights_dir`: the resolved directory new weights must come from."""
    app = FastAPI(title="agentrl engine (SGLang-compatible)")
    server = _Server(engine, model_path, weights_dir)
    app.state.server = server
    if token is not None:
        app.add_middleware(BearerAuth, token=token)

    @app.exception_handler(WireError)
    async def wire_error(_request: Request, exc: WireError):
        return _error(400, str(exc))

    async def _json(request: Request) -> dict:
        try:
            body = await request.json()
        except ValueError:
            raise WireError("request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise WireError("request body must be a JSON object")
        return body

    @app.post("/generate")
    async def generate(request: Request):
        try:
            return JSONResponse(await server.generate(await _json(request)))
        except (WireError, PromptTooLongError) as e:
            return _error(400, str(e))
        except ValueError as e:  # engine-side validation (e.g. token id outside the vocabulary)
            return _error(400, str(e))
        except EngineError as e:
            return _error(503, str(e))

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(request: Request):
        try:
            body = await _json(request)
        except WireError as e:
            return JSONResponse({"success": False, "message": str(e)}, status_code=400)
        return await server.update_weights_from_disk(body)

    @app.post("/init_weights_update_group")
    async def init_weights_update_group(request: Request):
        return await server.init_weights_update_group(await _json(request))

    @app.post("/update_weights_from_distributed")
    async def update_weights_from_distributed(request: Request):
        return await server.update_weights_from_distributed(await _json(request))

    @app.post("/destroy_weights_update_group")
    async def destroy_weights_update_group(request: Request):
        return await server.destroy_weights_update_group(await _json(request))

    @app.post("/pause_generation")
    async def pause_generation(request: Request):
        body = await _json(request) if await request.body() else {}
        mode = body.get("mode", "abort")
        if mode not in ("abort", "retract", "in_place"):
            return _error(400, f"pause_generation mode must be abort, retract or in_place, got {mode!r}")
        in_flight = await asyncio.to_thread(engine.pause, mode)
        return {"message": f"Generation paused ({mode}); {in_flight} requests were in flight.", "status": "ok"}

    @app.post("/continue_generation")
    async def continue_generation():
        engine.resume()
        return {"message": "Generation continued.", "status": "ok"}

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache():
        return JSONResponse({"success": True, "message": "Cache flushed (agentrl engine serve keeps no prefix "
                                                         "cache between requests)."})

    @app.post("/abort_request")
    async def abort_request(request: Request):
        body = await _json(request)
        if body.get("abort_all"):
            return {"success": True, "aborted": engine.abort_all()}
        rid = body.get("rid")
        if not isinstance(rid, str):
            return _error(400, "send rid (the request id) or abort_all=true")
        return {"success": True, "aborted": int(engine.abort(rid))}

    @app.post("/release_memory_occupation")
    @app.post("/resume_memory_occupation")
    async def memory_occupation():
        return _error(400, "release/resume_memory_occupation is not supported by agentrl engine serve: the CPU "
                           "engine allocates its KV cache per batch and frees it when idle")

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/health_generate")
    async def health_generate():
        from agentrl.types import SamplingParams

        try:
            await asyncio.wait_for(engine.generate([0], SamplingParams(max_new_tokens=1, temperature=0)), 60)
        except (EngineError, asyncio.TimeoutError) as e:
            return _error(503, f"engine cannot generate: {e}")
        return {"status": "ok"}

    @app.get("/get_model_info")
    @app.get("/model_info")
    async def model_info():
        return {"model_path": server.model_path, "tokenizer_path": server.model_path, "is_generation": True,
                "weight_version": server.weight_version, "max_model_len": engine.max_model_len,
                "vocab_size": engine.vocab_size}

    @app.get("/get_server_info")
    @app.get("/server_info")
    async def server_info():
        cfg = engine.config
        return {"backend": "agentrl-local", "model_path": server.model_path, "max_batch_size": cfg.max_batch_size,
                "max_model_len": engine.max_model_len, "max_queued_requests": cfg.max_queued_requests,
                "num_running": engine.num_running, "num_waiting": engine.num_waiting, "paused": engine.paused,
                "weight_version": server.weight_version, "stats": dict(engine.stats), "tp_size": 1,
                "weight_update_groups": sorted(server._groups)}

    return app


__all__ = ["WeightsDirError", "check_weights_dir", "create_app"]
