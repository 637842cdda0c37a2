"""ReplicatedEngine: the Engine protocol over N engine replicas (`engine.replicas: N`, backend "local").

Each replica is a LocalEngine in its own Ray actor (`replica_actor.py`), placed wherever the cluster has room.
This module is the policy and knows nothing of Ray: it drives anything that speaks `Replica`, so its tests use
replicas in the test's process.

- Routing (`routing.StickyRouter`): an episode's turns (same `session_id`) go to the replica that served its first
  turn (that replica's prefix cache holds the episode's KV); new episodes go to the replica with the fewest
  requests in flight.
- Weight updates: the state dict is shared once (`share`: Ray's object store) and every live replica loads it; the
  update waits for all of them, within `engine.replica_timeout_s`, and a `ReplicaTimeoutError` names the replicas
  that did not answer. `weight_version` moves only when all answered.
- Faults: a request whose replica died (`ReplicaDiedError`) is sent again, from the same input ids, to another
  live replica (at most `engine.max_replica_retries` times; `metrics()["engine/replica_retries"]` counts them), so
  a lost replica never turns into a failed or zero-reward episode. The dead replica is replaced in the background:
  a new one is started, answers a health check, loads the last pushed weights (and pauses, if the engine is
  paused) and only then takes requests again.

Use one engine from one event loop (its restarts run as tasks of that loop).
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, Protocol

from agentrl.inference.base import EngineError
from agentrl.inference.config import EngineConfig
from agentrl.inference.routing import StickyRouter
from agentrl.types import Generation, SamplingParams

log = logging.getLogger(__name__)


class ReplicaDiedError(EngineError):
    """A replica's process is gone (its Ray actor died or is unreachable); the request did not finish there."""


class ReplicaTimeoutError(EngineError):
    """Replicas did not answer a health check or weight update within `engine.replica_timeout_s`."""


class Replica(Protocol):
    """One engine replica as ReplicatedEngine drives it. Every call raises ReplicaDiedError once the replica's
    process is gone; other errors (PromptTooLongError, ValueError) are the request's and pass through."""

    name: str  # e.g. "engine replica 1 (node 10.0.0.3)": what error messages call it

    async def generate(self, input_ids: list[int], params: SamplingParams, session_id: str | None,
                       request_id: str) -> Generation: ...

    async def update_weights(self, weights: Any, version: int, on_running: str) -> int:
        """Load `weights` (what `share` made of a state dict, or a model directory); returns the version served."""
        ...

    async def ping(self) -> dict:
        """The health check: {"weight_version": int, ...} once the replica's engine is up."""
        ...

    async def pause(self, mode: str) -> int: ...

    async def resume(self) -> None: ...

    async def abort(self, request_id: str) -> bool: ...

    async def abort_all(self) -> int: ...

    async def stats(self) -> dict: ...

    async def close(self) -> None: ...

    def kill(self) -> None:
        """End the replica's process now, without waiting (best effort)."""
        ...


class ReplicatedEngine:
    """`replicas`: started replicas, each answering its health check. `spawn(i)` starts a replacement for replica
    `i` after it died. `share(state_dict)` makes what every replica's `update_weights` receives, once per update
    (default: the dict itself)."""

    def __init__(self, replicas: list[Replica], config: EngineConfig, *, spawn: Callable[[int], Replica],
                 share: Callable[[Mapping], Any] | None = None, tokenizer=None, max_model_len: int | None = None,
                 model_path: str | None = None, on_close: Callable[[], None] | None = None):
        if not replicas:
            raise ValueError("ReplicatedEngine needs at least one replica")
        self.config = config
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.model_path = model_path
        self._spawn, self._share, self._on_close = spawn, share or (lambda weights: weights), on_close
        self.replicas = list(replicas)
        self.healthy = [True] * len(replicas)
        self.router = StickyRouter(len(replicas))
        self.weight_version = 0  # the version every live replica serves (the last update all of them answered)
        self.counters = {"replica_retries": 0, "replica_restarts": 0}
        self.last_errors: dict[int, str] = {}  # replica -> why it went down, until it is back
        self._latest: tuple[Any, int] | None = None  # (shared weights, version) of the last push: restarts load it
        self._pushes = 0
        self._paused: str | None = None  # the pause mode while paused
        self._restarts: dict[int, asyncio.Task] = {}
        self._where: dict[str, int] = {}  # request id -> replica, while in flight
        self._closed = False

    # ------------------------------------------------------------------ lifecycle

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for task in self._restarts.values():
            task.cancel()
        live = [r for r, up in zip(self.replicas, self.healthy) if up]
        try:
            await asyncio.wait_for(asyncio.gather(*[r.close() for r in live], return_exceptions=True),
                                   self.config.replica_timeout_s)
        except TimeoutError:
            pass  # killed below all the same
        for r in self.replicas:
            r.kill()
        self.healthy = [False] * len(self.replicas)
        if self._on_close is not None:
            self._on_close()

    # ------------------------------------------------------------------ generate

    async def generate(self, input_ids: list[int], params: SamplingParams, *, session_id: str | None = None,
                       request_id: str | None = None) -> Generation:
        """See `agentrl.inference.base.Engine.generate`. `metrics["replica"]` says which replica answered and
        `metrics["replica_retries"]` how many died under this request before it."""
        rid = request_id or uuid.uuid4().hex
        tried: list[Replica] = []  # replicas that died under this request (a restarted one is a new replica)
        deaths: list[str] = []
        for attempt in range(self.config.max_replica_retries + 1):
            if attempt:
                self.counters["replica_retries"] += 1
            idx = await self._choose(session_id, tried)
            replica = self.replicas[idx]
            self.router.in_flight[idx] += 1
            self._where[rid] = idx
            try:
                gen = await replica.generate(list(input_ids), params, session_id, rid)
            except ReplicaDiedError as e:
                tried.append(replica)
                deaths.append(str(e))
                self._lost(idx, replica, str(e))
                continue
            finally:
                self.router.in_flight[idx] -= 1
                self._where.pop(rid, None)
            gen.metrics["replica"] = idx
            if attempt:
                gen.metrics["replica_retries"] = attempt
            return gen
        raise EngineError(f"the request's engine replica died {len(deaths)} time(s) "
                          f"(engine.max_replica_retries={self.config.max_replica_retries}): " + "; ".join(deaths))

    async def _choose(self, session_id: str | None, tried: list[Replica]) -> int:
        """A live replica this request has not died on; waits for a restart when there is none."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.replica_timeout_s
        retried = False
        while True:
            if self._closed:
                raise EngineError("the replicated engine is closed; create a new engine")
            down = {i for i, r in enumerate(self.replicas) if not self.healthy[i] or r in tried}
            if len(down) < len(self.replicas):
                return self.router.pick(session_id, down)
            if not retried:  # replicas whose restart failed get one more, once per request
                retried = True
                for i in range(len(self.replicas)):
                    if not self.healthy[i]:
                        self._restart_in_background(i)
            pending = set(self._restarts.values())
            left = deadline - loop.time()
            if not pending:
                raise EngineError(f"no engine replica is up and their restarts failed: {self._down_report()}")
            if left <= 0:
                raise EngineError(f"no engine replica came back within engine.replica_timeout_s="
                                  f"{self.config.replica_timeout_s:g}s: {self._down_report()}")
            await asyncio.wait(pending, timeout=left, return_when=asyncio.FIRST_COMPLETED)

    # ------------------------------------------------------------------ faults

    def _lost(self, idx: int, replica: Replica, why: str) -> None:
        """`replica` (at `idx`) died: take it out of routing and start its replacement, once."""
        if self.replicas[idx] is not replica or not self.healthy[idx]:
            return  # already known (another request saw it die first), or an old replica of this slot
        log.warning("%s; restarting it", why)
        self.healthy[idx] = False
        self.last_errors[idx] = why
        self._restart_in_background(idx)

    def _restart_in_background(self, idx: int) -> None:
        if self._closed or idx in self._restarts:
            return
        task = asyncio.ensure_future(self._restart(idx))
        self._restarts[idx] = task
        task.add_done_callback(lambda done: self._restarts.pop(idx) if self._restarts.get(idx) is done else None)

    async def _restart(self, idx: int) -> None:
        """Replace replica `idx`: a new one that answers a health check and serves the last pushed weights (paused
        as the engine is) before it takes requests. On failure the slot stays down; the next request that finds no
        replica up tries again."""
        self.replicas[idx].kill()
        self.counters["replica_restarts"] += 1
        new = self._spawn(idx)
        timeout = self.config.replica_timeout_s
        try:
            await asyncio.wait_for(new.ping(), timeout)
            synced, paused = 0, None
            while True:  # a push or a pause may land meanwhile: the replica catches up before it takes requests
                pushes, paused_now, latest = self._pushes, self._paused, self._latest
                if synced != pushes:
                    await asyncio.wait_for(new.update_weights(latest[0], latest[1], "continue"), timeout)
                    synced = pushes
                if paused != paused_now:
                    await asyncio.wait_for(new.pause(paused_now) if paused_now else new.resume(), timeout)
                    paused = paused_now
                serving = (await asyncio.wait_for(new.ping(), timeout))["weight_version"]
                if synced == self._pushes and paused == self._paused:
                    break
            expected = latest[1] if latest is not None else 0
            if serving != expected:
                raise EngineError(f"serves weight version {serving}, not {expected}")
        except (EngineError, TimeoutError, ValueError) as e:  # the slot stays down, named in errors
            new.kill()
            why = "no answer" if isinstance(e, TimeoutError) else str(e)
            self.last_errors[idx] = f"{new.name} did not come back: {why}"
            log.warning("%s", self.last_errors[idx])
            return
        if self._closed:
            new.kill()
            return
        self.replicas[idx] = new
        self.healthy[idx] = True
        self.last_errors.pop(idx, None)
        log.warning("%s is back, serving weight version %s", new.name, serving)

    def _down_report(self) -> str:
        return "; ".join(self.last_errors.get(i, f"{r.name} is down") for i, r in enumerate(self.replicas)
                         if not self.healthy[i])

    async def _fan_out(self, what: str, method: str, *args, only: int | None = None,
                       late_is_dead: bool = False) -> dict[int, Any]:
        """`replica.method(*args)` on every live replica (or on replica `only`), awaited within
        engine.replica_timeout_s; returns {replica: answer} of the ones that answered. A replica that died is
        restarted (it loads the newest weights before it takes work). Replicas that did not answer in time raise
        ReplicaTimeoutError naming them, or with `late_is_dead` are replaced as dead ones are. Any other error is
        raised as it is."""
        targets = self._live() if only is None else [only]
        tasks = {asyncio.ensure_future(getattr(self.replicas[i], method)(*args)): (i, self.replicas[i])
                 for i in targets}
        if not tasks:
            return {}
        done, late = await asyncio.wait(tasks, timeout=self.config.replica_timeout_s)
        for task in late:
            task.cancel()
        answers: dict[int, Any] = {}
        for task in done:
            (i, replica), error = tasks[task], task.exception()
            if isinstance(error, ReplicaDiedError):
                self._lost(i, replica, str(error))
            elif error is not None:
                raise error
            else:
                answers[i] = task.result()
        if not late:
            return answers
        slow = sorted(tasks[t] for t in late)
        why = f"did not answer the {what} within engine.replica_timeout_s={self.config.replica_timeout_s:g}s"
        if late_is_dead:
            for i, replica in slow:
                self._lost(i, replica, f"{replica.name} {why}")
            return answers
        raise ReplicaTimeoutError(f"{', '.join(r.name for _, r in slow)} {why}: see the replica's log (Ray's "
                                  f"`ray logs`), or raise engine.replica_timeout_s for a large model")

    def _live(self) -> list[int]:
        return [i for i, up in enumerate(self.healthy) if up]

    # ------------------------------------------------------------------ weights and control

    async def update_weights(self, weights: Mapping | str | Path, *, on_running: Literal["continue", "abort"] =
                             "continue", version: int | None = None) -> None:
        """Load new weights on every replica: a state dict (shared once, see `share`) or a model directory every
        replica can read. Waits for every live replica (engine.replica_timeout_s; ReplicaTimeoutError names the
        late ones). `on_running` and `version` as `LocalEngine.update_weights`; replicas restarted later load
        these weights before they take requests."""
        if on_running not in ("continue", "abort"):
            raise ValueError(f"on_running must be 'continue' or 'abort', got {on_running!r}")
        version = self.weight_version + 1 if version is None else version
        # off the event loop: putting a large model into the object store takes seconds
        shared = str(weights) if isinstance(weights, (str, Path)) else await asyncio.to_thread(self._share, weights)
        self._latest = (shared, version)
        self._pushes += 1
        await self._fan_out(f"weight update to version {version}", "update_weights", shared, version, on_running)
        self.weight_version = version

    async def check_health(self) -> list[int]:
        """Ping every live replica; the ones that died or did not answer within
        engine.replica_timeout_s are replaced. Returns the replicas that answered."""
        return sorted(await self._fan_out("health check", "ping", late_is_dead=True))

    async def pause(self, mode: Literal["abort", "retract", "in_place"] = "in_place") -> int:
        """`LocalEngine.pause` on every replica (restarted ones come up paused); returns the requests in flight."""
        if mode not in ("abort", "retract", "in_place"):
            raise ValueError(f"pause mode must be abort, retract or in_place, got {mode!r}")
        self._paused = mode
        answers = await self._fan_out("pause", "pause", mode)
        return sum(answers.values())

    async def resume(self) -> None:
        self._paused = None
        await self._fan_out("resume", "resume")

    async def abort(self, request_id: str) -> bool:
        """Finish `request_id` with "abort" on the replica running it; False if it is unknown or done."""
        idx = self._where.get(request_id)
        if idx is None or not self.healthy[idx]:
            return False
        return bool((await self._fan_out("abort", "abort", request_id, only=idx)).get(idx))

    async def abort_all(self) -> int:
        return sum((await self._fan_out("abort", "abort_all")).values())

    async def replica_stats(self) -> dict[int, dict]:
        """Each live replica's `LocalEngine.stats` (decode steps, prefill tokens, ...)."""
        return await self._fan_out("stats", "stats")

    def metrics(self) -> dict[str, float]:
        """Counters for the step's metrics: requests retried after their replica died, replicas restarted, and
        replicas up now."""
        return {"engine/replica_retries": float(self.counters["replica_retries"]),
                "engine/replica_restarts": float(self.counters["replica_restarts"]),
                "engine/replicas_up": float(sum(self.healthy))}


def model_max_len(model_path: str | Path, config: EngineConfig) -> int | None:
    """engine.max_model_len, else the model's max_position_embeddings (as LocalEngine decides it)."""
    if config.max_model_len:
        return config.max_model_len
    path = Path(model_path) / "config.json"
    if not path.is_file():
        return None
    return json.loads(path.read_text()).get("max_position_embeddings") or None


__all__ = ["Replica", "ReplicaDiedError", "ReplicaTimeoutError", "ReplicatedEngine", "model_max_len"]
