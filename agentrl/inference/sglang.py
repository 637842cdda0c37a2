"""SGLangEngine: the Engine protocol over one or more SGLang servers' native HTTP API.

Routing (`routing.StickyRouter`): an episode's turns (same `session_id`) go to the same server so its radix cache
reuses the shared prefix; new sessions and session-less requests go to the server with the fewest requests in flight.
Connection errors and 5xx answers are retried (on another server when there is one) before an `EngineError`.
Weight updates call `/update_weights_from_disk` on every server (the SGLang router does not broadcast them), or
come from the trainer's process-group broadcast (`agentrl.inference.weight_broadcast`) inside `weight_update()`.
Works against real SGLang (GPU) and against `agentrl engine serve` (CPU), which speaks the same format.
With `engine.token_file` every request carries `Authorization: Bearer <token>` (SGLang's `--api-key`, `engine
serve --token-file`); `start()` checks the token on each server; a 401 is a `ServiceAuthError`, never retried.

LoRA adapters: `load_lora_adapter(name, path)` / `unload_lora_adapter(name)` call SGLang's routes on every server;
after `set_lora_adapter(name, version)` every /generate names the adapter (`lora_path`) and its tokens record
`version` (SGLang reports the base weights' label for them). `agentrl.trainer.lora_sync` drives these per step.

Partial rollouts: `pause_generation(mode)` / `continue_generation()` broadcast SGLang's routes around a weight
update. A request that comes back aborted because this client paused the servers keeps its tokens (each with the
version its response reported), waits for `continue_generation()` and is resubmitted as prompt + tokens so far for
the remaining `max_new_tokens`, so one `generate()` returns one Generation whose tokens each carry the version
that sampled them. A weight update this client sends with `abort_in_flight` ends the requests in flight with
"abort" and `metrics["aborted_by"] = "weight_update"` (as LocalEngine says it), so the agent loop samples the turn
again under the new weights. A pause or an update by another client is not known here: its aborts reach the
caller as a plain "abort".
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any, AsyncIterator

import httpx

from agentrl.auth import ServiceAuthError, bearer_headers, unauthorized
from agentrl.inference.base import EngineError, PromptTooLongError
from agentrl.inference.config import EngineConfig
from agentrl.inference.routing import StickyRouter
from agentrl.inference.wire import generation_from_wire, sampling_params_to_wire, version_from_label
from agentrl.retry import backoff_delay
from agentrl.types import Generation, SamplingParams

_RETRYABLE = (httpx.TransportError,)  # connect/read errors, timeouts, protocol errors
_MAX_BACKOFF_S = 30.0  # cap on one wait between /generate attempts (the base is engine.retry_backoff_s)
_TOKEN_KEY = "engine.token_file"


class SGLangEngine:
    def __init__(self, urls: list[str], config: EngineConfig | None = None, *,
                 transport: httpx.AsyncBaseTransport | None = None):
        """`transport` replaces the network (e.g. `httpx.MockTransport` in tests of routing and retries)."""
        if not urls:
            raise ValueError("SGLangEngine needs at least one server URL, e.g. ['http://127.0.0.1:30000']")
        self.urls = [u.rstrip("/") for u in urls]
        self.config = config or EngineConfig(backend="sglang", urls=list(self.urls))
        self.router = StickyRouter(len(self.urls))
        self._clients: list[httpx.AsyncClient] | None = None
        self._started = False
        self._start_lock: asyncio.Lock | None = None
        self._transport = transport
        self._background: set[asyncio.Task] = set()
        self._resumed = asyncio.Event()  # cleared from pause_generation until continue_generation
        self._resumed.set()
        self._pauses = 0  # pause_generation calls so far: a request that saw one while in flight resumes
        self._abort_updates = 0  # update_weights(abort_in_flight=True) calls begun so far
        self._aborting = 0  # of them, the ones not answered yet
        # the version of the weights the servers serve: 0 for those they started with ("default"), then the number
        # of the label of this client's last update_weights (None: a label that is not a number), or the version of
        # the LoRA adapter set_lora_adapter made active
        self.weight_version: int | None = 0
        self._lora: tuple[str, int | None] | None = None  # (adapter name every /generate names, its version)

    # ------------------------------------------------------------------ lifecycle

    def _http(self) -> list[httpx.AsyncClient]:
        if self._clients is None:
            limits = httpx.Limits(max_connections=self.config.max_connections,
                                  max_keepalive_connections=self.config.max_connections)
            timeout = httpx.Timeout(self.config.request_timeout_s, connect=10.0)
            headers = bearer_headers(self.config.token_file, _TOKEN_KEY)
            self._clients = [httpx.AsyncClient(base_url=u, limits=limits, timeout=timeout, transport=self._transport,
                                               headers=headers) for u in self.urls]
        return self._clients

    async def start(self) -> None:
        """Wait until every server answers /health (engine.health_timeout_s) and, with engine.token_file, takes
        the token (a 401 on /get_model_info raises ServiceAuthError naming engine.token_file). Called on first use."""
        if self._started:
            return
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if self._started:
                return
            await asyncio.gather(*[self._wait_healthy(i) for i in range(len(self.urls))])
            self._started = True

    async def _wait_healthy(self, i: int) -> None:
        deadline = time.monotonic() + self.config.health_timeout_s
        last = ""
        while True:
            try:
                r = await self._http()[i].get("/health", timeout=5.0)
                if r.status_code == 200:
                    if self.config.token_file:  # /health is open: ask a route behind the token whether it is ours
                        self._check_auth(i, await self._http()[i].get("/get_model_info", timeout=30.0))
                    return
                last = f"HTTP {r.status_code}"
            except httpx.TransportError as e:
                last = f"{type(e).__name__}: {e}"
            if time.monotonic() > deadline:
                raise EngineError(f"SGLang server {self.urls[i]} not healthy after {self.config.health_timeout_s}s "
                                  f"(last: {last}); is it running? (agentrl engine launch-sglang / engine serve)")
            await asyncio.sleep(0.5)

    def _check_auth(self, i: int, r: httpx.Response) -> None:
        if r.status_code == 401:
            raise unauthorized(f"SGLang server {self.urls[i]}", _TOKEN_KEY, _error_message(r))

    async def close(self) -> None:
        if self._background:  # let pending aborts of cancelled requests go out first
            await asyncio.wait(set(self._background), timeout=10.0)
        if self._clients is not None:
            await asyncio.gather(*[c.aclose() for c in self._clients])
            self._clients = None
        self._started = False

    # ------------------------------------------------------------------ routing

    @property
    def in_flight(self) -> list[int]:
        """Requests on the wire to each server now."""
        return self.router.in_flight

    def server_for(self, session_id: str) -> str | None:
        """The URL an episode is pinned to (None before its first turn)."""
        idx = self.router.pinned(session_id)
        return None if idx is None else self.urls[idx]

    # ------------------------------------------------------------------ generate

    async def generate(self, input_ids: list[int], params: SamplingParams, *, session_id: str | None = None,
                       request_id: str | None = None) -> Generation:
        """See `agentrl.inference.base.Engine.generate`; resumes requests aborted by `pause_generation`."""
        await self.start()
        rid = request_id or uuid.uuid4().hex
        ids: list[int] = []
        logprobs: list[float] = []
        versions: list[int] | None = []  # None once a part could not say which version sampled its tokens
        resumes = 0
        while True:
            pauses, abort_updates = self._pauses, self._abort_updates
            part_params = params if not ids else replace(
                params, max_new_tokens=params.max_new_tokens - len(ids),
                min_new_tokens=max(0, params.min_new_tokens - len(ids)))
            gen = await self._generate_once(list(input_ids) + ids, part_params, session_id,
                                            rid if not resumes else f"{rid}-resume{resumes}")
            ids += gen.token_ids
            logprobs += gen.logprobs
            versions = versions + gen.weight_versions if versions is not None and (
                gen.weight_versions or not gen.token_ids) else None
            paused_meanwhile = pauses != self._pauses or not self._resumed.is_set()
            if gen.finish_reason == "abort" and (abort_updates != self._abort_updates or self._aborting):
                gen.metrics["aborted_by"] = "weight_update"  # our update ended it: the caller samples it again
                paused_meanwhile = False
            if gen.finish_reason != "abort" or not paused_meanwhile or len(ids) >= params.max_new_tokens:
                break
            await self._resumed.wait()
            resumes += 1
        if not resumes:
            return gen
        reason = "length" if gen.finish_reason == "abort" and len(ids) >= params.max_new_tokens else gen.finish_reason
        metrics = {**gen.metrics, "prompt_tokens": len(input_ids), "completion_tokens": len(ids),
                   "resumed_after_pause": resumes}
        return Generation(token_ids=ids, logprobs=logprobs, finish_reason=reason, metrics=metrics,
                          weight_versions=versions or [])

    async def _generate_once(self, input_ids: list[int], params: SamplingParams, session_id: str | None,
                             rid: str) -> Generation:
        body: dict[str, Any] = {
            "input_ids": list(input_ids),
            "sampling_params": sampling_params_to_wire(params),
            "return_logprob": True,
            "logprob_start_len": -1,
            "top_logprobs_num": 0,
            "stream": False,
        }
        lora = self._lora  # the adapter when this part is sent: a later switch applies to the next part
        if lora is not None:
            body["lora_path"] = lora[0]
        # Every request carries a rid so a cancelled call (episode timeout) can stop the server's work on it.
        body["rid"] = rid
        tried: set[int] = set()
        last_error = ""
        attempts = self.config.connect_retries + 1
        for attempt in range(attempts):
            if attempt:
                await asyncio.sleep(backoff_delay(attempt - 1, self.config.retry_backoff_s, _MAX_BACKOFF_S))
            idx = self.router.pick(session_id, tried)
            self.router.in_flight[idx] += 1
            try:
                r = await self._http()[idx].post("/generate", json=body)
            except asyncio.CancelledError:
                self._abort_in_background(idx, rid)
                raise
            except _RETRYABLE as e:
                last_error = f"{self.urls[idx]}: {type(e).__name__}: {e}"
            else:
                if r.status_code == 200:
                    return self._parse(r, idx, lora)
                self._check_auth(idx, r)
                message = _error_message(r)
                if r.status_code == 400:
                    if "context" in message or "max_model_len" in message or "too long" in message:
                        raise PromptTooLongError(f"{self.urls[idx]}: {message}")
                    raise ValueError(f"SGLang server {self.urls[idx]} rejected the request: {message}")
                last_error = f"{self.urls[idx]}: HTTP {r.status_code}: {message}"
                if r.status_code < 500:
                    break
            finally:
                self.router.in_flight[idx] -= 1
            tried.add(idx)
            if len(tried) >= len(self.urls):
                tried.clear()
        raise EngineError(f"SGLang generate failed after {attempt + 1} attempt(s): {last_error}")

    def _abort_in_background(self, idx: int, rid: str) -> None:
        async def send() -> None:
            try:
                await self._http()[idx].post("/abort_request", json={"rid": rid}, timeout=10.0)
            except httpx.HTTPError:
                pass  # best effort: the server finishes the request and nobody reads the answer

        task = asyncio.get_running_loop().create_task(send())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _parse(self, r: httpx.Response, idx: int, lora: tuple[str, int | None] | None) -> Generation:
        try:
            gen = generation_from_wire(r.json())
        except (ValueError, KeyError, TypeError, IndexError) as e:
            raise EngineError(f"SGLang server {self.urls[idx]} sent an unexpected /generate answer: {e}") from None
        gen.metrics["server"] = self.urls[idx]
        if lora is not None:
            # SGLang labels a request's tokens with the base weights' version whatever adapter sampled them; the
            # adapter named is the one that did (a request holds its adapter until it finishes)
            gen.metrics["lora_adapter"] = lora[0]
            if lora[1] is not None:
                gen.weight_versions = [lora[1]] * len(gen.token_ids)
        return gen

    # ------------------------------------------------------------------ control

    async def _broadcast(self, method: str, path: str, body: dict | None = None,
                         timeout: float | None = None, tolerate: str | None = None) -> list[dict]:
        """Send the request to every server; raise EngineError naming each one that failed (an answer whose error
        message holds `tolerate` counts as done)."""
        await self.start()

        async def one(i: int) -> dict:
            try:
                r = await self._http()[i].request(method, path, json=body, timeout=timeout or
                                                  self.config.request_timeout_s)
            except httpx.TransportError as e:
                raise EngineError(f"{self.urls[i]}{path}: {type(e).__name__}: {e}") from None
            self._check_auth(i, r)
            data = r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
            if not isinstance(data, dict):
                data = {"result": data}
            if r.status_code != 200 or data.get("success") is False:
                message = _error_message(r)
                if tolerate is not None and tolerate in message:
                    return data
                raise EngineError(f"{self.urls[i]}{path} failed: HTTP {r.status_code}: {message}")
            return data

        results = await asyncio.gather(*[one(i) for i in range(len(self.urls))], return_exceptions=True)
        refused = next((e for e in results if isinstance(e, ServiceAuthError)), None)
        if refused is not None:
            raise refused
        errors = [str(e) for e in results if isinstance(e, BaseException)]
        if errors:
            raise EngineError(f"{len(errors)} of {len(self.urls)} servers failed: " + "; ".join(errors))
        return results

    async def update_weights(self, weights: str | Path, *, abort_in_flight: bool = False, version: int | None = None,
                             weight_version: str | None = None, flush_cache: bool = True) -> None:
        """Load a HF checkpoint directory on every server (`/update_weights_from_disk`), labelled `weight_version`
        (or `str(version)`, the Engine protocol's version number).

        SGLang waits for in-flight requests unless `abort_in_flight` (then they finish with "abort", and
        `metrics["aborted_by"] = "weight_update"`).
        The directory must be readable by every server (shared filesystem on multi-node clusters).
        """
        if not isinstance(weights, (str, Path)):
            raise TypeError("SGLangEngine.update_weights takes a checkpoint directory (str or Path); save the "
                            "state dict with save_pretrained first")
        body: dict[str, Any] = {"model_path": str(weights), "abort_all_requests": abort_in_flight,
                                "flush_cache": flush_cache}
        async with self.weight_update(version=version, weight_version=weight_version,
                                      abort_in_flight=abort_in_flight) as label:
            if label is not None:
                body["weight_version"] = label
            await self._broadcast("POST", "/update_weights_from_disk", body)

    @contextlib.asynccontextmanager
    async def weight_update(self, *, version: int | None = None, weight_version: str | None = None,
                            abort_in_flight: bool = False) -> AsyncIterator[str | None]:
        """Bracket one weight update of every server (`update_weights`, or the trainer's broadcast, which sends
        the tensors from elsewhere): yields the label to send (`weight_version`, else `str(version)`); requests
        the update aborts are marked `aborted_by=weight_update`; once it succeeded, `weight_version` is its
        version."""
        if weight_version is None and version is not None:
            weight_version = str(version)
        self._abort_updates += abort_in_flight  # before the request: aborted answers may arrive before it returns
        self._aborting += abort_in_flight
        try:
            yield weight_version
        finally:
            self._aborting -= abort_in_flight
        self.weight_version = version_from_label(weight_version) if weight_version is not None else None

    # ------------------------------------------------------------------ LoRA adapters

    @property
    def lora_adapter(self) -> str | None:
        """The adapter every /generate names now (None: the base weights)."""
        return None if self._lora is None else self._lora[0]

    async def load_lora_adapter(self, name: str, path: str | Path) -> list[dict]:
        """Load the peft adapter directory `path` as `name` on every server (SGLang's `/load_lora_adapter`; the
        servers need --enable-lora and must read `path`); returns each server's loaded adapters (name -> path).
        Raises EngineError naming the servers that refused, e.g. a name already loaded there."""
        body = {"lora_name": name, "lora_path": str(path)}
        results = await self._broadcast("POST", "/load_lora_adapter", body)
        return [r.get("loaded_adapters") or {} for r in results]

    async def unload_lora_adapter(self, name: str, *, missing_ok: bool = False) -> None:
        """Unload adapter `name` from every server (`/unload_lora_adapter`; each finishes its requests naming it
        first). `missing_ok`: a server that does not hold it counts as done."""
        await self._broadcast("POST", "/unload_lora_adapter", {"lora_name": name},
                              tolerate="does not exist" if missing_ok else None)

    def set_lora_adapter(self, name: str | None, version: int | None = None) -> None:
        """From now on every /generate names adapter `name` (`lora_path`; None: the base weights), and the tokens it
        samples record weight version `version` (None: the label the servers report), which `weight_version`
        becomes. Load the adapter on every server first (`load_lora_adapter`)."""
        self._lora = None if name is None else (name, version)
        if name is not None:
            self.weight_version = version

    async def pause_generation(self, mode: str = "abort") -> None:
        """Pause every server (`/pause_generation`) before a weight update. "abort": requests in flight return
        now with their tokens so far and `generate()` resubmits them after `continue_generation()`; "retract" /
        "in_place": the servers hold them. Requests sent while paused wait for `continue_generation()`."""
        if mode not in ("abort", "retract", "in_place"):
            raise ValueError(f"pause_generation mode must be abort, retract or in_place, got {mode!r}")
        self._resumed.clear()  # before the request: aborted answers may arrive before it returns
        self._pauses += 1
        await self._broadcast("POST", "/pause_generation", {"mode": mode})

    async def continue_generation(self) -> None:
        """Resume every server (`/continue_generation`), then the requests `pause_generation` aborted."""
        await self._broadcast("POST", "/continue_generation", {})
        self._resumed.set()

    async def flush_cache(self) -> None:
        await self._broadcast("POST", "/flush_cache")

    async def release_memory_occupation(self, tags: list[str] | None = None) -> None:
        """Free KV cache and/or weights on every server (needs --enable-memory-saver)."""
        await self._broadcast("POST", "/release_memory_occupation", {"tags": tags} if tags else {})

    async def resume_memory_occupation(self, tags: list[str] | None = None) -> None:
        await self._broadcast("POST", "/resume_memory_occupation", {"tags": tags} if tags else {})

    async def abort(self, request_id: str) -> None:
        await self._broadcast("POST", "/abort_request", {"rid": request_id})

    async def abort_all(self) -> None:
        await self._broadcast("POST", "/abort_request", {"abort_all": True})

    async def model_info(self) -> dict:
        await self.start()
        for path in ("/get_model_info", "/model_info"):
            r = await self._http()[0].get(path)
            if r.status_code == 200:
                return r.json()
        raise EngineError(f"{self.urls[0]} answers neither /get_model_info nor /model_info")

    async def weight_labels(self) -> list[str]:
        """Each server's `weight_version` label (/get_model_info): "default" for the weights it started with."""
        return [str(info.get("weight_version", "default")) for info in await self._broadcast("GET", "/get_model_info")]


def _error_message(r: httpx.Response) -> str:
    try:
        data = r.json()
    except ValueError:
        return r.text[:500]
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])
        if isinstance(err, str):  # SGLang's 401: {"error": "Unauthorized"}
            return err
        if data.get("error_message"):  # SGLang's LoRA routes
            return str(data["error_message"])
        if "message" in data:
            return str(data["message"])
        if "detail" in data:
            return str(data["detail"])
    return str(data)[:500]


__all__ = ["SGLangEngine"]
