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

LoRA (`--enable-lora`, `lora_serving.py`): SGLang's `/load_lora_adapter` {lora_name, lora_path, pinned} and
`/unload_lora_adapter` {lora_name} answer SGLang's {success, error_message, loaded_adapters}; a /generate naming an
adapter in `lora_path` is decoded from the base weights with that adapter merged in, one without it from the base
weights. Loading an adapter makes its name the server's `weight_version` (the newest weights it holds), and the
tokens an adapter samples carry its name as their label. A malformed adapter is refused with one line and the
server keeps serving what it had.

Access: with a `token` (`--token-file`) every route but `GET /health` needs `Authorization: Bearer <token>`, as
SGLang's `--api-key` does (`agentrl.auth`). With a `weights_dir` (`--weights-dir`), `/update_weights_from_disk`
loads only from directories under it (symlinks and `..` resolved first) and answers 403 for any other path; it
is required beyond loopback, where anyone holding the token could otherwise make the server read any directory;
`/load_lora_adapter` reads only from under it too.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from agentrl.auth import BearerAuth, is_loopback
from agentrl.errors import UserError
from agentrl.inference.base import EngineError, PromptTooLongError
from agentrl.inference.local import LocalEngine
from agentrl.inference.lora_adapters import AdapterError
from agentrl.inference.lora_serving import LoraAdapters
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
         "return_text_in_logprobs", "rid", "stream", "lora_path"}
_IGNORED = {"lora_id", "session_id", "log_metrics", "priority", "routed_dp_rank", "data_parallel_rank",
            "disagg_prefill_dp_rank", "routing_key", "conversation_id", "extra_key", "cache_salt", "kv_hints",
            "custom_labels", "no_logs", "external_trace_header", "received_time", "http_worker_ipc", "background"}


class WeightsDirError(UserError):
    """`--weights-dir` is missing where it is required, or is not a directory."""


class LoraArgsError(UserError):
    """LoRA limits (--max-lora-rank, --lora-target-modules) without --enable-lora, or out of range."""


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


@dataclass(frozen=True)
class LoraOptions:
    """`agentrl engine serve --enable-lora` and the limits SGLang takes at launch (lora_serving.py)."""
    max_loaded: int = 2  # --max-loaded-loras: each loaded adapter holds a copy of the model's weights
    max_rank: int | None = None  # --max-lora-rank: None, any rank
    target_modules: tuple[str, ...] = ()  # --lora-target-modules: empty (or "all"), any module


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
                 group_timeout_s: float = 300.0, lora: LoraOptions | None = None):
        self.engine = engine
        self.model_path = model_path
        self.weights_dir = weights_dir
        self.base_label = "default"  # the weight_version label of the base weights
        self._labels = {engine.weight_version: self.base_label}  # engine version -> weight_version label
        self._order = itertools.count()  # numbers base weight loads and adapter loads: which weights are newest
        self._base_loaded = next(self._order)
        self.lora = None if lora is None else LoraAdapters(
            engine, max_loaded=lora.max_loaded, max_rank=lora.max_rank,
            target_modules=set(lora.target_modules) if lora.target_modules else None, order=self._order)
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

    @property
    def weight_version(self) -> str:
        """The label of the newest weights this server holds: the base weights' label, or the name of a LoRA
        adapter loaded after them (so loading an adapter moves it, and tokens it samples carry its name)."""
        newest = self.lora.newest() if self.lora is not None else None
        return newest[1] if newest is not None and newest[0] > self._base_loaded else self.base_label

    def engines(self) -> list[LocalEngine]:
        """The base engine and every LoRA adapter's."""
        return [self.engine, *(self.lora.engines() if self.lora is not None else [])]

    def _adapters(self, body: dict, n: int, batched: bool) -> list[str | None]:
        """`lora_path` per input (SGLang: an adapter name, or a list with one name or null per input)."""
        names = _per_item(body.get("lora_path"), n, "lora_path", batched)
        for name in names:
            if name is not None and not isinstance(name, str):
                raise WireError(f"lora_path must be an adapter name (a string), a list of them (null: the base "
                                f"weights) or null, got {name!r}")
            if name and self.lora is None:
                raise WireError(f"LoRA adapter {name!r} (lora_path) was requested, but LoRA is not enabled: start "
                                f"agentrl engine serve with --enable-lora and load adapters with /load_lora_adapter")
            if name:
                self.lora.check(name)
        return [name or None for name in names]

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
        """Fields set beyond `_READ` and `_IGNORED` (multimodal inputs, extra outputs, ...) are refused."""
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
        adapters = self._adapters(body, n, batched)
        with_text = bool(body.get("return_text_in_logprobs", False))
        items = await asyncio.gather(*[self._one(seq, p, opts, bool(ret), str(r), with_text, adapter)
                                       for seq, (p, opts), ret, r, adapter in zip(seqs, parsed, rets, rids, adapters)])
        return items if batched else items[0]

    async def _one(self, ids: list[int], params, text_opts: dict, return_logprob: bool, rid: str,
                   with_text: bool, adapter: str | None) -> dict:
        t0 = time.perf_counter()
        if adapter is None:
            gen = await self.engine.generate(ids, params, request_id=rid)
            label = self.label
        else:  # the adapter's own engine; every token it samples is labelled with the adapter's name
            async with self.lora.serving(adapter) as engine:
                gen = await engine.generate(ids, params, request_id=rid)
            label = lambda _version: adapter  # noqa: E731
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
            "weight_version": label(gen.metrics["weight_version"]),
            "weight_versions": weight_version_spans([label(v) for v in gen.weight_versions],
                                                    label(gen.metrics["weight_version"])),
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
        try:
            path = self.allowed_path(path, "model_path")
        except PermissionError as e:
            return JSONResponse({"success": False, "message": str(e)}, status_code=403)
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

    def allowed_path(self, path: str, field: str) -> str:
        """The path to read new weights from: with --weights-dir, `path` with links resolved, which must lie under
        it (else PermissionError, HTTP 403)."""
        if self.weights_dir is None:
            return path
        resolved = Path(path).resolve()
        if not resolved.is_relative_to(self.weights_dir):
            raise PermissionError(f"{field} {path} (resolved: {resolved}) is not under this server's --weights-dir "
                                  f"{self.weights_dir}: save the weights there")
        return str(resolved)  # load the path that was checked, not the one sent

    async def _load(self, weights, label: str | None, abort: bool) -> None:
        """Swap in new weights (a directory or a state dict) labelled `label` (default: the update count), and
        merge the loaded LoRA adapters onto them. Call under the update lock."""
        version = self.engine.weight_version + 1
        self._labels[version] = label or str(version)  # before the swap: tokens sampled right after need it
        on_running = "abort" if abort else "continue"
        try:
            await self.engine.update_weights(weights, on_running=on_running)
        except BaseException:
            del self._labels[version]
            raise
        self.base_label = self._labels[version]
        self._base_loaded = next(self._order)
        if self.lora is not None:
            await self.lora.rebase(on_running)

    # ------------------------------------------------------------------ LoRA adapters (lora_serving.py)

    async def load_lora_adapter(self, body: dict) -> JSONResponse:
        name, path = body.get("lora_name"), body.get("lora_path")
        if self.lora is None:
            return _lora_result(False, "LoRA is not enabled. Start agentrl engine serve with --enable-lora (SGLang: "
                                       "--enable-lora) to load adapters.", None)
        if not (isinstance(name, str) and name and isinstance(path, str) and path):
            return _lora_result(False, "send lora_name (the adapter's name) and lora_path (the directory peft's "
                                       "save_pretrained wrote), both strings", self.lora.loaded())
        try:
            path = self.allowed_path(path, "lora_path")
        except PermissionError as e:
            return _lora_result(False, str(e), self.lora.loaded(), status=403)
        async with self._update_lock:
            try:
                await self.lora.load(name, path, pinned=bool(body.get("pinned")))
            except AdapterError as e:
                return _lora_result(False, str(e), self.lora.loaded())
            except OSError as e:  # a directory or file this server may not read
                return _lora_result(False, f"Failed to load LoRA adapter {name} from {path}: {e}; make it "
                                           f"readable by the server", self.lora.loaded())
        return _lora_result(True, "", self.lora.loaded())

    async def unload_lora_adapter(self, body: dict) -> JSONResponse:
        name = body.get("lora_name")
        if self.lora is None:
            return _lora_result(False, "LoRA is not enabled. Start agentrl engine serve with --enable-lora.", None)
        if not isinstance(name, str) or not name:
            return _lora_result(False, "send lora_name, the name of a loaded adapter", self.lora.loaded())
        try:
            await self.lora.unload(name)
        except AdapterError as e:
            return _lora_result(False, str(e), self.lora.loaded())
        return _lora_result(True, "", self.lora.loaded())

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


def _lora_result(success: bool, message: str, loaded: dict | None, status: int = 400) -> JSONResponse:
    """SGLang's LoRAUpdateOutput: {success, error_message, loaded_adapters (name -> path)}, 200 or `status`."""
    return JSONResponse({"success": success, "error_message": message, "loaded_adapters": loaded},
                        status_code=200 if success else status)


def create_app(engine: LocalEngine, model_path: str, *, token: str | None = None,
               weights_dir: Path | None = None, lora: LoraOptions | None = None) -> FastAPI:
    """The FastAPI app; run it with uvicorn (see `agentrl.inference.cli`). `token`: the bearer token every route
    but /health requires (None: no check); `weights_dir`: the resolved directory new weights must come from;
    `lora`: serve LoRA adapters (None: /load_lora_adapter refuses, as SGLang without --enable-lora)."""
    app = FastAPI(title="agentrl engine (SGLang-compatible)")
    server = _Server(engine, model_path, weights_dir, lora=lora)
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

    @app.post("/load_lora_adapter")
    async def load_lora_adapter(request: Request):
        return await server.load_lora_adapter(await _json(request))

    @app.post("/unload_lora_adapter")
    async def unload_lora_adapter(request: Request):
        return await server.unload_lora_adapter(await _json(request))

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
        in_flight = sum(await asyncio.gather(*[asyncio.to_thread(e.pause, mode) for e in server.engines()]))
        return {"message": f"Generation paused ({mode}); {in_flight} requests were in flight.", "status": "ok"}

    @app.post("/continue_generation")
    async def continue_generation():
        for e in server.engines():
            e.resume()
        return {"message": "Generation continued.", "status": "ok"}

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache():
        return JSONResponse({"success": True, "message": "Cache flushed (agentrl engine serve keeps no prefix "
                                                         "cache between requests)."})

    @app.post("/abort_request")
    async def abort_request(request: Request):
        body = await _json(request)
        if body.get("abort_all"):
            return {"success": True, "aborted": sum(e.abort_all() for e in server.engines())}
        rid = body.get("rid")
        if not isinstance(rid, str):
            return _error(400, "send rid (the request id) or abort_all=true")
        return {"success": True, "aborted": int(any(e.abort(rid) for e in server.engines()))}

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
                "weight_update_groups": sorted(server._groups), "enable_lora": server.lora is not None,
                "loaded_adapters": server.lora.loaded() if server.lora is not None else {}}

    return app


__all__ = ["LoraArgsError", "LoraOptions", "WeightsDirError", "check_weights_dir", "create_app"]
