"""LocalEngine: a transformers causal LM behind the Engine protocol, with continuous batching on CPU/one GPU.

Why our own scheduler: transformers 5.x ships continuous batching (`generate_batch`,
`ContinuousBatchingManager`), but it samples with one global `do_sample` switch and the global torch RNG (no
per-request greedy/sampling mix, no per-request seed), its logprobs are taken after top-k/top-p processing
(not the trainer's `log_softmax(logits / T)`), and it has no stop strings. RL needs all of those exactly.

How it works: `generate()` is called from many coroutines; each call enqueues a request and awaits a future.
One decode thread (off the event loop, so tool calls keep being serviced while the model runs) loops:

1. drop aborted rows; admit waiting requests into free slots (up to `max_batch_size` rows and
   `max_prefill_tokens` uncached prompt tokens per step); identical prompts are prefilled once, each prompt after
   the longest prefix a cache holds (its session's last turn, or a recent prompt: `prefix_cache.py`), several
   in one pass, right-padded in groups of similar length (`prefill.py`), and the first tokens sampled;
2. one forward pass decodes one token for every running row over a left-padded KV cache (`kv_batch.py`);
3. finished rows (stop token, EOS, stop string, max_new_tokens, context full) leave the batch and their futures
   are resolved, one event-loop wake-up per step.

Weight updates take the same lock as a scheduler step, so they land between steps and no step mixes weights.
Every sampled token records the version that sampled it (`Generation.weight_versions`). Rows in flight at an
update either continue (`on_running="continue"`: each is retracted, its prompt + tokens so far re-prefilled under
the new weights, so no token is ever sampled over KV of the old weights) or finish with "abort"
(`on_running="abort"`: the caller restarts the turn). `pause()` / `resume()` hold the scheduler between steps
(`agentrl engine serve`'s `/pause_generation`); requests submitted meanwhile wait.

Memory: the decode batch's KV cache is at most `max_batch_size x max_model_len` token slots; waiting requests
hold only their prompt ids (at most `max_queued_requests` of them); finished turns of a `session_id` keep their
KV for the episode's next turn, at most `prefix_cache_tokens` tokens in all; prefilled prompts keep theirs for
prompts sharing a prefix, at most `shared_prefix_cache_tokens` (`prefix_cache.py`).
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Mapping

import torch

from agentrl.inference.base import EngineError, ModelNotFoundError, PromptTooLongError
from agentrl.inference.config import EngineConfig
from agentrl.inference.kv_batch import PaddedKVBatch, RowKV, cache_kwarg
from agentrl.inference.prefill import LastLayerTrim, plan_groups, prefill_after_prefixes
from agentrl.inference.prefix_cache import SessionPrefixCache, SharedPrefixCache
from agentrl.inference.sampling import make_generator, sample_batch
from agentrl.types import Generation, SamplingParams

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class _Request:
    rid: str
    prompt: list[int]
    params: SamplingParams
    max_new: int  # max_new_tokens clamped so prompt + output fits max_model_len
    stop_ids: frozenset[int]  # ids that end the request (none with ignore_eos)
    min_ids: frozenset[int]  # ids masked while fewer than min_new_tokens were generated
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    generator: torch.Generator | None
    t_submit: float
    out_ids: list[int] = field(default_factory=list)
    out_logprobs: list[float] = field(default_factory=list)
    out_versions: list[int] = field(default_factory=list)  # the weight version that sampled each out_ids entry
    aborted: bool = False
    t_start: float = 0.0
    weight_version_start: int = 0
    length_clamped: bool = False
    matched_stop: int | str | None = None
    finished: bool = False
    session_id: str | None = None
    cached_tokens: int = 0

    def context(self) -> list[int]:
        """What the next prefill of this request covers: the prompt, plus the tokens sampled so far when a
        weight update retracted it (the last of them is fed to the next decode step, as for any running row)."""
        return self.prompt + self.out_ids if self.out_ids else self.prompt


@dataclass
class _Prefill:
    """One distinct prompt of an admission: its cached prefix (m, K/V) if any, then its prefilled K/V and logits."""
    prompt: list[int]
    prefix: tuple[int, list] | None
    from_session: bool
    row: RowKV | None = None
    logits: torch.Tensor | None = None

    @property
    def start(self) -> int:
        return 0 if self.prefix is None else self.prefix[0]


def _eos_ids(model, tokenizer) -> set[int]:
    ids: set[int] = set()
    gen_cfg = getattr(model, "generation_config", None)
    eos = getattr(gen_cfg, "eos_token_id", None) if gen_cfg is not None else None
    if isinstance(eos, int):
        ids.add(eos)
    elif eos:
        ids.update(int(e) for e in eos)
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return ids


class LocalEngine:
    """Embedded rollout engine. Construct with `from_pretrained(path, config)` or from a loaded model."""

    def __init__(self, model, tokenizer=None, config: EngineConfig | None = None):
        self.config = config or EngineConfig()
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.device = next(model.parameters()).device
        model_max = int(getattr(model.config, "max_position_embeddings", 0) or 0)
        self.max_model_len = self.config.max_model_len or model_max
        if self.max_model_len < 2:
            raise ValueError("cannot tell the model's context length: set engine.max_model_len")
        if model_max and self.max_model_len > model_max:
            raise ValueError(f"engine.max_model_len={self.max_model_len} exceeds the model's "
                             f"max_position_embeddings={model_max}")
        self.vocab_size = int(model.config.vocab_size)
        self.eos_token_ids = frozenset(_eos_ids(model, tokenizer))
        # transformers renamed `past_key_values` to `cache` (5.2x); use whichever this model's forward takes.
        self._cache_kw = cache_kwarg(model)
        self._trim = LastLayerTrim(self.model)  # prefill: the last layer's output only where logits are read
        self._trim.verify(self.model, self._cache_kw, self.device)
        self.weight_version = 0
        self._ids = itertools.count()
        self._cv = threading.Condition()  # guards _waiting, _closed and request.aborted
        self._step_lock = threading.Lock()  # one scheduler step or one weight update at a time
        self._waiting: deque[_Request] = deque()
        self._running: list[_Request] = []
        self._admitting: list[_Request] = []
        self._finished: list[tuple[_Request, Generation]] = []  # resolved after each step (_post_finished)
        self._by_id: dict[str, _Request] = {}
        self._closed = False
        self._paused = False
        self._aborts_pending = False  # abort()/abort_all() flagged requests that the next step must finish
        # Called on the decode thread after every scheduler step, outside the step lock (so it may itself call
        # update_weights_sync or pause): tests place weight updates between known decode steps with it.
        self.step_hook: Callable[[LocalEngine], None] | None = None
        self._batch = PaddedKVBatch(self.max_model_len, self.config.max_batch_size)
        # a ready-made 4D mask skips transformers' mask construction each step; SDPA takes bool masks
        self._mask_4d = getattr(model.config, "_attn_implementation", None) == "sdpa"
        self._prefix = SessionPrefixCache(self.config.prefix_cache_tokens)
        self._shared = SharedPrefixCache(self.config.shared_prefix_cache_tokens)
        self.stats = {"steps": 0, "prefills": 0, "prefill_tokens": 0, "cached_tokens": 0, "max_rows": 0,
                      "max_token_slots": 0, "retracted": 0}
        self._thread = threading.Thread(target=self._run, name="agentrl-local-engine", daemon=True)
        self._thread.start()

    @classmethod
    def from_pretrained(cls, path: str | Path, config: EngineConfig | None = None) -> "LocalEngine":
        from transformers import AutoModelForCausalLM, AutoTokenizer

        config = config or EngineConfig()
        path = Path(path)
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"{path} is not a Hugging Face model directory (no config.json): "
                                     f"build one with `agentrl init-model` or pass a downloaded model dir")
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=_DTYPES[config.dtype]).to(config.device)
        return cls(model, tokenizer, config)

    # ------------------------------------------------------------------ public API (event-loop side)

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    async def generate(self, input_ids: list[int], params: SamplingParams, *, session_id: str | None = None,
                       request_id: str | None = None) -> Generation:
        """Continue `input_ids`; see `agentrl.inference.base.Engine.generate`.

        `request_id` names the request for `abort(request_id)`. Cancelling the awaiting task aborts the request
        and frees its slot. `session_id` (the episode id) lets the next turn of the episode reuse this turn's KV
        cache (`engine.prefix_cache_tokens`), so only the new tokens are prefilled.
        """
        request = self._make_request(list(input_ids), params, request_id)
        request.session_id = session_id
        with self._cv:
            if self._closed:
                raise EngineError("LocalEngine is closed; create a new engine")
            if len(self._waiting) >= self.config.max_queued_requests:
                raise EngineError(f"LocalEngine queue full: {len(self._waiting)} requests waiting "
                                  f"(engine.max_queued_requests={self.config.max_queued_requests}); lower the "
                                  f"rollout concurrency or raise the limit")
            if request.rid in self._by_id:
                raise ValueError(f"request_id {request.rid!r} is already in flight")
            self._by_id[request.rid] = request
            self._waiting.append(request)
            self._cv.notify()
        try:
            return await asyncio.shield(request.future)
        except asyncio.CancelledError:
            self.abort(request.rid)
            # nobody awaits the result any more; retrieve a late exception so asyncio does not log it
            request.future.add_done_callback(lambda f: f.cancelled() or f.exception())
            raise

    def _make_request(self, input_ids: list[int], params: SamplingParams, request_id: str | None) -> _Request:
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be agentrl.types.SamplingParams, got {type(params).__name__}")
        if not input_ids:
            raise ValueError("input_ids is empty: the prompt needs at least one token")
        bad = [t for t in input_ids if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"input_ids holds {len(bad)} ids outside [0, {self.vocab_size}) (vocab size), "
                             f"e.g. {bad[0]!r}")
        if params.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer: build the engine with LocalEngine.from_pretrained "
                             "or pass tokenizer=")
        if len(input_ids) >= self.max_model_len:
            raise PromptTooLongError(f"prompt has {len(input_ids)} tokens but the context window "
                                     f"(max_model_len) is {self.max_model_len}: at least one token must be left "
                                     f"to generate; shorten the prompt or raise engine.max_model_len")
        room = self.max_model_len - len(input_ids)
        loop = asyncio.get_running_loop()
        return _Request(
            rid=request_id or f"local-{next(self._ids)}",
            prompt=input_ids, params=params, max_new=min(params.max_new_tokens, room),
            # as SGLang: ignore_eos ignores EOS and stop_token_ids alike; min_new_tokens masks both
            stop_ids=frozenset() if params.ignore_eos else frozenset(params.stop_token_ids) | self.eos_token_ids,
            min_ids=frozenset(params.stop_token_ids) | self.eos_token_ids,
            loop=loop, future=loop.create_future(),
            generator=make_generator(params.seed) if params.temperature > 0 else None,
            t_submit=time.perf_counter(), length_clamped=params.max_new_tokens > room,
        )

    def abort(self, request_id: str) -> bool:
        """Finish `request_id` with finish_reason "abort" (partial output kept). False if it is unknown/done."""
        with self._cv:
            request = self._by_id.get(request_id)
            if request is None:
                return False
            request.aborted = True
            self._aborts_pending = True
            self._cv.notify()
            return True

    def abort_all(self) -> int:
        """Abort every waiting and running request; returns how many were aborted."""
        with self._cv:
            for request in self._by_id.values():
                request.aborted = True
            self._aborts_pending = True
            self._cv.notify()
            return len(self._by_id)

    @property
    def paused(self) -> bool:
        return self._paused

    def pause(self, mode: Literal["abort", "retract", "in_place"] = "in_place") -> int:
        """Stop scheduling between two steps; returns how many requests were in flight.

        "abort": every waiting and running request finishes now with finish_reason "abort" (tokens so far kept).
        "retract": running rows give their KV back and are re-prefilled (prompt + tokens so far) on `resume()`.
        "in_place": running rows keep their KV. Either way requests submitted while paused wait for `resume()`,
        and a weight update while paused re-prefills the rows in flight (`update_weights`' on_running).
        """
        if mode not in ("abort", "retract", "in_place"):
            raise ValueError(f"pause mode must be abort, retract or in_place, got {mode!r}")
        with self._cv:
            self._paused = True
            in_flight = len(self._by_id)
        with self._step_lock:  # the step in progress, if any, ends before pause returns
            if mode == "abort":
                self._abort_in_flight("pause", waiting_too=True)
            elif mode == "retract":
                self._retract_running()
            self._post_finished()
        return in_flight

    def resume(self) -> None:
        """Let the scheduler run again after `pause()`."""
        with self._cv:
            self._paused = False
            self._cv.notify()

    async def update_weights(self, weights: Mapping[str, torch.Tensor] | str | Path, *,
                             on_running: Literal["continue", "abort"] = "continue", version: int | None = None) -> None:
        """Load new weights between scheduler steps: a state dict, or a HF model directory on disk.

        `on_running` says what happens to rows decoding when the weights change. "continue": each row is
        retracted and re-prefilled (prompt + tokens so far) under the new weights, then decodes on; its earlier
        tokens keep their old version in `Generation.weight_versions`. "abort": the rows finish now with
        finish_reason "abort", the tokens so far and `metrics["aborted_by"] = "weight_update"`, so the caller can
        restart the turn. Waiting requests start on the new weights either way. `version` numbers the new weights
        (the trainer passes the step that made them, so versions survive a resume); None: the previous version + 1.
        """
        await asyncio.to_thread(self.update_weights_sync, weights, on_running=on_running, version=version)

    def update_weights_sync(self, weights: Mapping[str, torch.Tensor] | str | Path, *,
                            on_running: Literal["continue", "abort"] = "continue", version: int | None = None) -> int:
        if on_running not in ("continue", "abort"):
            raise ValueError(f"on_running must be 'continue' or 'abort', got {on_running!r}")
        if version is not None and (isinstance(version, bool) or not isinstance(version, int) or version < 0):
            raise ValueError(f"update_weights: version must be an int >= 0, got {version!r}")
        if isinstance(weights, (str, Path)):
            weights = self._load_state_dict(Path(weights))
        own = self.model.state_dict()
        unexpected = [k for k in weights if k not in own]
        if unexpected:
            raise ValueError(f"update_weights: {len(unexpected)} names are not parameters of this model, e.g. "
                             f"{unexpected[:3]} (strip FSDP/DDP prefixes such as '_orig_mod.' or 'module.')")
        tied = {"lm_head.weight"} if getattr(self.model.config, "tie_word_embeddings", False) else set()
        missing = [k for k in own if k not in weights and k not in tied]
        if missing:
            raise ValueError(f"update_weights: {len(missing)} parameters are missing from the new weights, "
                             f"e.g. {missing[:3]}; send the full state dict")
        for name, tensor in weights.items():
            if tuple(tensor.shape) != tuple(own[name].shape):
                raise ValueError(f"update_weights: {name} has shape {tuple(tensor.shape)}, the model expects "
                                 f"{tuple(own[name].shape)}")
        with self._step_lock, torch.no_grad():
            if on_running == "abort":  # before the swap, so each aborted request reports the version it ran on
                self._abort_in_flight("weight_update")
                self._post_finished()
            else:
                self._retract_running()
            for name, tensor in weights.items():
                own[name].copy_(tensor.to(device=own[name].device, dtype=own[name].dtype))
            self.weight_version = self.weight_version + 1 if version is None else version
            self._prefix.clear()  # KV computed with the old weights must not seed new requests
            self._shared.clear()
            self._batch.release()  # no row is left in the batch: give the idle KV buffers back
        return self.weight_version

    def clone_model(self):
        """A deep copy of the served model, taken between scheduler steps (a prefill's hooks are never on it then);
        `agentrl engine serve` merges a LoRA adapter into one (`lora_serving.py`)."""
        with self._step_lock:
            return copy.deepcopy(self.model)

    def _retract_running(self) -> None:
        """Move the running rows back to the front of the queue, in order, dropping their KV; they are
        re-prefilled (`_Request.context`) at the next admission. Call under the step lock."""
        retracted = self._running
        if not retracted:
            return
        self._batch.drop(list(range(len(retracted))))
        self._running = []
        with self._cv:
            self._waiting.extendleft(reversed(retracted))
        self.stats["retracted"] += len(retracted)

    def _abort_in_flight(self, by: str, waiting_too: bool = False) -> None:
        """Finish every running request and every retracted one (tokens so far) with "abort", `by` naming the cause
        (`Generation.metrics["aborted_by"]`); requests not yet started stay queued unless `waiting_too`. Call under
        the step lock."""
        with self._cv:
            retracted = [r for r in self._waiting if r.out_ids or waiting_too]
            self._waiting = deque(r for r in self._waiting if not (r.out_ids or waiting_too))
        running, self._running = self._running, []
        if running:
            self._batch.drop(list(range(len(running))))
        for r in [*running, *retracted]:
            self._finish(r, "abort", aborted_by=by)

    def _load_state_dict(self, path: Path) -> dict[str, torch.Tensor]:
        from transformers import AutoModelForCausalLM

        if not (path / "config.json").is_file():
            raise ValueError(f"update_weights: {path} is not a Hugging Face model directory (no config.json)")
        return AutoModelForCausalLM.from_pretrained(path, dtype=self.model.dtype).state_dict()

    async def close(self) -> None:
        await asyncio.to_thread(self.close_sync)

    def close_sync(self) -> None:
        """Stop the decode thread; pending requests fail with EngineError("closed")."""
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join(timeout=60)

    # ------------------------------------------------------------------ decode thread

    def _run(self) -> None:
        if self.config.num_threads:
            torch.set_num_threads(self.config.num_threads)
        with torch.inference_mode():
            while True:
                with self._cv:
                    while not self._closed and not self._aborts_pending and (
                            self._paused or (not self._waiting and not self._running)):
                        self._cv.wait()
                    if self._closed:
                        break
                    paused, self._aborts_pending = self._paused, False
                try:
                    with self._step_lock:
                        if paused:  # aborted requests still return while the scheduler is paused
                            self._drop_aborted()
                        else:
                            self._step()
                except Exception as e:  # thread boundary: fail the batch, keep serving
                    log.exception("local engine step failed")
                    self._fail_running(EngineError(f"local engine step failed: {type(e).__name__}: {e}"))
                finally:
                    self._post_finished()
                if self.step_hook is not None and not paused:
                    self.step_hook(self)
        self._fail_all(EngineError("LocalEngine was closed while the request was pending"))

    def _step(self) -> None:
        self._drop_aborted()
        self._admit()
        if self._running:
            self._decode()
        self.stats["steps"] += 1

    def _drop_aborted(self) -> None:
        with self._cv:
            aborted_waiting = [r for r in self._waiting if r.aborted]
            if aborted_waiting:
                self._waiting = deque(r for r in self._waiting if not r.aborted)
        for r in aborted_waiting:
            self._finish(r, "abort", aborted_by="request")
        aborted = [i for i, r in enumerate(self._running) if r.aborted]
        if aborted:
            finished = [self._running[i] for i in aborted]
            order = self._batch.drop(aborted)
            self._running = [self._running[i] for i in order]
            for r in finished:
                self._finish(r, "abort", aborted_by="request")

    def _admit(self) -> None:
        budget = self.config.max_prefill_tokens
        admitted: list[_Request] = []
        seen: set[tuple[int, ...]] = set()
        with self._cv:
            while self._waiting and len(self._running) + len(admitted) < self.config.max_batch_size:
                nxt = self._waiting[0]
                key = tuple(nxt.context())
                cost = 0 if key in seen else len(key) - self._cached_length(nxt)
                if admitted and cost > budget:
                    break
                budget -= cost
                seen.add(key)
                admitted.append(self._waiting.popleft())
        if not admitted:
            return
        self._admitting = admitted  # failed by _fail_running if a prefill raises
        # identical prompts (the n samples of a GRPO group) are prefilled once; each prompt after its cached prefix
        unique: dict[tuple[int, ...], int] = {}
        work: list[_Prefill] = []
        slot = []
        contexts = [r.context() for r in admitted]
        for r, context in zip(admitted, contexts):
            if not r.out_ids:  # a first admission, not a re-prefill after a weight update
                r.t_start = time.perf_counter()
                r.weight_version_start = self.weight_version
            hit = self._prefix.take(r.session_id, context) if r.session_id and self._prefix.max_tokens else None
            key = tuple(context)
            j = unique.get(key)
            if j is None:
                j = unique[key] = len(work)
                work.append(_Prefill(context, hit, from_session=hit is not None))
                if hit is None and self._shared.max_tokens:
                    work[j].prefix = self._shared.lookup(context)
            slot.append(j)
        misses = [w for w in work if w.prefix is None]
        if self._shared.max_tokens and len(misses) > 1:
            # prompts admitted together share prefixes too (a suite's system prompt): prefill one of them first,
            # so the others start after what they share with it
            self._prefill([misses[0]])
            for w in misses[1:]:
                w.prefix = self._shared.lookup(w.prompt)
        rest = [w for w in work if w.row is None]
        for group in plan_groups([len(w.prompt) - w.start for w in rest], self.config.max_prefill_tokens):
            self._prefill([rest[g] for g in group])
        for r, j in zip(admitted, slot):
            if not r.out_ids:
                r.cached_tokens = work[j].start
        logits = [work[j].logits for j in slot]
        tokens, logprobs = sample_batch(torch.stack(logits), [r.params for r in admitted],
                                        [r.generator for r in admitted], _banned(admitted))
        joined, joined_rows, joined_lengths = [], [], []
        for r, j, token, logprob in zip(admitted, slot, tokens, logprobs):
            reason = self._append(r, token, logprob)
            if reason is not None:
                self._remember(r, reason, [(k.unsqueeze(0).clone(), v.unsqueeze(0).clone()) for k, v in work[j].row])
                self._finish(r, reason)
                continue
            joined.append(r)
            joined_rows.append(work[j].row)
            joined_lengths.append(len(work[j].prompt))
        self._batch.add(joined_rows, joined_lengths)
        self._running.extend(joined)
        self._admitting = []

    def _prefill(self, items: list[_Prefill]) -> None:
        """Prefill `items` in one pass; a first-turn prompt's KV is kept for prompts sharing a prefix with it."""
        rows, logits = prefill_after_prefixes(self.model, [w.prompt for w in items], [w.prefix for w in items],
                                              self._cache_kw, self.device, trim=self._trim)
        for w, row, lg in zip(items, rows, logits):
            w.row, w.logits = row, lg
            self._count_prefill(len(w.prompt) - w.start, w.start)
            if not w.from_session and self._shared.max_tokens and w.start < len(w.prompt) - 1:
                self._shared.put(w.prompt, [(k.unsqueeze(0).clone(), v.unsqueeze(0).clone()) for k, v in row])

    def _cached_length(self, r: _Request) -> int:
        """Prompt tokens of `r` whose KV a cache holds (its session's last turn, or a prompt sharing a prefix)."""
        context = r.context()
        m = self._prefix.match(r.session_id, context) if self._prefix.max_tokens else 0
        return m or (self._shared.match(context) if self._shared.max_tokens else 0)

    def _count_prefill(self, tokens: int, cached: int) -> None:
        self.stats["prefills"] += 1
        self.stats["prefill_tokens"] += tokens
        self.stats["cached_tokens"] += cached

    def _remember(self, r: _Request, reason: str, kv: list) -> None:
        """Keep a finished session turn's KV (prompt + output minus the last sampled token) for its next turn."""
        if r.session_id and reason != "abort" and self._prefix.max_tokens:
            self._prefix.put(r.session_id, r.prompt + r.out_ids[:-1], kv)

    def _decode(self) -> None:
        self._batch.reserve_step()
        mask, pos_B_1 = self._batch.step_inputs(self._mask_4d)
        ids_B_1 = torch.tensor([[r.out_ids[-1]] for r in self._running], dtype=torch.long, device=self.device)
        out = self.model(input_ids=ids_B_1, attention_mask=mask, position_ids=pos_B_1, use_cache=True,
                         **{self._cache_kw: self._batch.cache})
        self._batch.advance()
        self.stats["max_rows"] = max(self.stats["max_rows"], len(self._running))
        self.stats["max_token_slots"] = max(self.stats["max_token_slots"], self._batch.token_slots())
        logits_B_V = out.logits[:, -1, :].float().cpu()
        tokens, logprobs = sample_batch(logits_B_V, [r.params for r in self._running],
                                        [r.generator for r in self._running], _banned(self._running))
        done = []
        for i, (r, t, lp) in enumerate(zip(self._running, tokens, logprobs)):
            reason = self._append(r, t, lp)
            if reason is not None:
                done.append((i, r, reason))
                if r.session_id:
                    self._remember(r, reason, self._batch.row_kv(i))
        if done:
            order = self._batch.drop([i for i, _, _ in done])
            self._running = [self._running[i] for i in order]
            for _, r, reason in done:  # resolve after the batch shrank, so callers see the slot free
                self._finish(r, reason)

    def _append(self, r: _Request, token: int, logprob: float) -> str | None:
        """Record a sampled token; return the finish reason if the request is done, else None."""
        r.out_ids.append(token)
        r.out_logprobs.append(logprob)
        r.out_versions.append(self.weight_version)
        if token in r.stop_ids:
            r.matched_stop = token
            return "stop"
        if r.params.stop:
            matched = self._matched_stop_string(r)
            if matched is not None:
                r.matched_stop = matched
                return "stop"
        if len(r.out_ids) >= r.max_new:
            return "length"
        return None

    def _matched_stop_string(self, r: _Request) -> str | None:
        # Only the tail can hold a new match (an earlier one would have stopped the request); 4 tokens per
        # character covers byte-level tokens of multi-byte characters.
        tail = r.out_ids[-(4 * max(len(s) for s in r.params.stop) + 4):]
        text = self.tokenizer.decode(tail, skip_special_tokens=False)
        return next((s for s in r.params.stop if s and s in text), None)

    def _finish(self, r: _Request, reason: str, *, aborted_by: str | None = None) -> None:
        """Queue `r`'s Generation for `_post_finished`. An aborted request says why in `metrics["aborted_by"]`:
        "request" (`abort`, `abort_all`, a cancelled caller), "pause" (`pause("abort")`) or "weight_update"
        (`update_weights(on_running="abort")`: the agent loop restarts the turn)."""
        r.finished = True
        now = time.perf_counter()
        gen = Generation(
            token_ids=list(r.out_ids), logprobs=list(r.out_logprobs), finish_reason=reason,
            weight_versions=list(r.out_versions),
            metrics={
                "prompt_tokens": len(r.prompt), "completion_tokens": len(r.out_ids),
                "queue_s": (r.t_start or now) - r.t_submit, "latency_s": now - r.t_submit,
                "weight_version": self.weight_version, "weight_version_start": r.weight_version_start,
                "length_clamped_to_context": r.length_clamped,
                "cached_tokens": r.cached_tokens,  # prompt tokens whose KV came from the session's last turn
                "matched_stop": r.matched_stop,  # the stop token id or stop string that ended a "stop" request
            },
        )
        if aborted_by is not None:
            gen.metrics["aborted_by"] = aborted_by
        with self._cv:
            self._by_id.pop(r.rid, None)
        self._finished.append((r, gen))

    def _post_finished(self) -> None:
        """Resolve the step's finished requests: one wake-up per event loop, not one per request (each wake-up
        hands the GIL to the event-loop thread and stalls this one)."""
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        for r, gen in self._finished:
            by_loop.setdefault(r.loop, []).append((r.future, gen, None))
        self._finished = []
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_resolve_all, items)
            except RuntimeError:  # the caller's event loop is already closed: nobody is waiting for the result
                pass

    def _fail_running(self, error: EngineError) -> None:
        for r in [*self._running, *self._admitting]:
            if r.finished:
                continue
            r.finished = True
            with self._cv:
                self._by_id.pop(r.rid, None)
            _post(r, None, error)
        self._running, self._admitting = [], []
        self._batch = PaddedKVBatch(self.max_model_len, self.config.max_batch_size)

    def _fail_all(self, error: EngineError) -> None:
        self._fail_running(error)
        with self._cv:
            waiting, self._waiting = list(self._waiting), deque()
            self._by_id.clear()
        for r in waiting:
            _post(r, None, error)


def _banned(rows: list[_Request]) -> list[frozenset[int] | None]:
    """Per row, the ids it may not sample now: EOS and stop tokens until min_new_tokens were generated."""
    return [r.min_ids if len(r.out_ids) < r.params.min_new_tokens else None for r in rows]


def _post(r: _Request, result: Any, error: BaseException | None) -> None:
    try:
        r.loop.call_soon_threadsafe(_resolve, r.future, result, error)
    except RuntimeError:  # the caller's event loop is already closed: nobody is waiting for the result
        pass


def _resolve_all(items: list[tuple[asyncio.Future, Any, BaseException | None]]) -> None:
    for future, result, error in items:
        _resolve(future, result, error)


def _resolve(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


__all__ = ["LocalEngine"]
