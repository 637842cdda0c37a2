"""ReplicatedEngine's policy over replicas living in the test's process (no Ray): sticky sessions, least loaded
for new ones, a dead replica's requests retried on another and counted, restarts that load the newest weights
before taking work, weight updates that name the replica that did not answer. Plus the router on its own and the
weights' trip through the object store's format."""

from __future__ import annotations

import asyncio

import pytest
import torch

from agentrl.inference.base import EngineError
from agentrl.inference.config import EngineConfig
from agentrl.inference.replicas import ReplicaDiedError, ReplicatedEngine, ReplicaTimeoutError
from agentrl.inference.routing import StickyRouter
from agentrl.types import Generation, SamplingParams

PARAMS = SamplingParams(max_new_tokens=4, temperature=0)


class FakeReplica:
    """Answers every prompt with one token (the prompt's length), stamped with the version it serves. `hold`
    keeps generate calls waiting; `kill` ends it: held and later calls raise ReplicaDiedError."""

    def __init__(self, index: int, *, alive: bool = True):
        self.name = f"fake replica {index}"
        self.version = 0
        self.weights = None
        self.dead = not alive
        self.hold = asyncio.Event()
        self.hold.set()
        self.weights_hold = asyncio.Event()
        self.weights_hold.set()
        self.ping_hold = asyncio.Event()
        self.ping_hold.set()
        self.sessions: list[str | None] = []
        self.paused: str | None = None
        self.closed = False

    def _check(self) -> None:
        if self.dead:
            raise ReplicaDiedError(f"{self.name} died: killed")

    async def generate(self, input_ids, params, session_id, request_id) -> Generation:
        self._check()
        self.sessions.append(session_id)
        await self.hold.wait()
        self._check()
        return Generation(token_ids=[len(input_ids)], logprobs=[0.0], finish_reason="stop",
                          weight_versions=[self.version], metrics={})

    async def update_weights(self, weights, version, on_running) -> int:
        self._check()
        await self.weights_hold.wait()
        self.weights, self.version = weights, version
        return version

    async def ping(self) -> dict:
        await self.ping_hold.wait()
        self._check()
        return {"weight_version": self.version}

    async def pause(self, mode) -> int:
        self._check()
        self.paused = mode
        return 0

    async def resume(self) -> None:
        self._check()
        self.paused = None

    async def abort(self, request_id) -> bool:
        return False

    async def abort_all(self) -> int:
        return 0

    async def stats(self) -> dict:
        return {}

    async def close(self) -> None:
        self.closed = True

    def kill(self) -> None:
        self.dead = True
        self.hold.set()


class Cluster:
    """Replicas 0..n-1 and the replacements the engine spawned, in order."""

    def __init__(self, n: int, *, spawn_alive: bool = True):
        self.replicas = [FakeReplica(i) for i in range(n)]
        self.spawned: list[FakeReplica] = []
        self.spawn_alive = spawn_alive
        self.next_spawn: FakeReplica | None = None  # a prepared replacement (e.g. one whose ping is held)

    def spawn(self, i: int) -> FakeReplica:
        new, self.next_spawn = self.next_spawn or FakeReplica(i, alive=self.spawn_alive), None
        self.spawned.append(new)
        return new

    def engine(self, **config) -> ReplicatedEngine:
        cfg = EngineConfig(replicas=len(self.replicas), **config)
        return ReplicatedEngine(self.replicas, cfg, spawn=self.spawn)


async def until(condition, what: str) -> None:
    """Yield to the event loop until `condition()` holds (bounded by steps, not by time)."""
    for _ in range(10_000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"never happened: {what}")


def test_router_sticks_sessions_and_sends_new_ones_to_the_least_loaded():
    router = StickyRouter(3)
    router.in_flight[:] = [2, 0, 1]
    assert router.pick("a") == 1  # least loaded
    router.in_flight[1] = 5
    assert router.pick("a") == 1  # sticky, however loaded
    assert router.pick("b") == 2
    assert router.pick(None) == 2 and router.pinned("c") is None
    assert router.pick("a", exclude={1}) == 2 and router.pinned("a") == 2  # excluded: the session moves
    assert router.pick("d", exclude={0, 1, 2}) == 2  # all excluded: the least loaded of all
    small = StickyRouter(2, max_sessions=2)
    for s in ("x", "y", "z"):
        small.pick(s)
    assert small.pinned("x") is None and small.pinned("z") is not None  # bounded: the oldest session goes


async def test_an_episodes_turns_stay_on_one_replica_and_new_episodes_go_to_the_least_loaded():
    cluster = Cluster(2)
    engine = cluster.engine()
    first = await engine.generate([1, 2], PARAMS, session_id="ep")
    home = first.metrics["replica"]
    other = 1 - home
    cluster.replicas[home].hold.clear()  # the home replica gets busy
    busy = [asyncio.ensure_future(engine.generate([1, 2, 3], PARAMS, session_id="ep"))]
    await until(lambda: engine.router.in_flight[home] == 1, "the second turn in flight")
    new = await engine.generate([7], PARAMS, session_id="new-episode")
    assert new.metrics["replica"] == other  # the least loaded
    busy += [asyncio.ensure_future(engine.generate([1, 2, 3, 4], PARAMS, session_id="ep"))]
    await until(lambda: engine.router.in_flight[home] == 2, "the third turn in flight")
    cluster.replicas[home].hold.set()
    turns = await asyncio.gather(*busy)
    assert [t.metrics["replica"] for t in turns] == [home, home]  # however loaded
    assert cluster.replicas[home].sessions == ["ep"] * 3
    assert cluster.replicas[other].sessions == ["new-episode"]
    assert engine.router.in_flight == [0, 0]


async def test_a_dead_replicas_requests_finish_on_another_and_it_comes_back_with_the_latest_weights():
    cluster = Cluster(2)
    engine = cluster.engine()
    weights = {"w": torch.ones(2)}
    await engine.update_weights(weights, version=7)
    for replica in cluster.replicas:
        replica.hold.clear()
    requests = [asyncio.ensure_future(engine.generate([1] * (i + 1), PARAMS, session_id=f"ep{i}")) for i in range(6)]
    await until(lambda: engine.router.in_flight == [3, 3], "requests on both replicas")
    on_zero = list(cluster.replicas[0].sessions)
    cluster.replicas[0].kill()
    cluster.replicas[1].hold.set()
    gens = await asyncio.gather(*requests)
    # every request completed, with its own answer (the same input ids were sent again), none as a failure
    assert [g.token_ids for g in gens] == [[i + 1] for i in range(6)]
    assert all(g.finish_reason == "stop" for g in gens)
    retried = [g for g in gens if g.metrics.get("replica_retries")]
    assert len(retried) == 3 and all(g.metrics["replica"] == 1 for g in retried)
    assert engine.metrics()["engine/replica_retries"] == 3.0
    assert all(engine.router.pinned(s) == 1 for s in on_zero)  # those episodes moved to replica 1
    # the replacement comes back serving the last pushed weights, then takes new episodes again
    await until(lambda: all(engine.healthy), "replica 0 restarted")
    new = cluster.spawned[0]
    assert engine.replicas[0] is new and new.version == 7 and new.weights is weights
    assert engine.metrics()["engine/replica_restarts"] == 1.0
    cluster.replicas[1].hold.clear()
    held = asyncio.ensure_future(engine.generate([5], PARAMS, session_id="ep0"))  # pinned to 1 now
    await until(lambda: engine.router.in_flight[1] == 1, "a request on replica 1")
    fresh = await engine.generate([5], PARAMS, session_id="fresh")
    assert fresh.metrics["replica"] == 0 and fresh.weight_versions == [7]
    cluster.replicas[1].hold.set()
    await held
    await engine.close()


async def test_a_restarting_replica_catches_up_with_weights_pushed_meanwhile_before_taking_work():
    cluster = Cluster(2)
    engine = cluster.engine()
    await engine.update_weights({"w": torch.zeros(1)}, version=1)
    slow_start = FakeReplica(0)
    slow_start.ping_hold.clear()
    cluster.next_spawn = slow_start
    cluster.replicas[0].kill()
    await engine.generate([1], PARAMS, session_id="a")  # routed to 0 first or not: it completes either way
    await engine.check_health()  # finds replica 0 dead if the request did not
    assert engine.healthy == [False, True]
    await until(lambda: cluster.spawned, "a replacement spawned")
    await engine.update_weights({"w": torch.ones(1)}, version=2)  # while the replacement starts
    await engine.pause("in_place")
    assert engine.weight_version == 2 and engine.healthy == [False, True]
    slow_start.ping_hold.set()
    await until(lambda: all(engine.healthy), "replica 0 back")
    assert slow_start.version == 2 and slow_start.paused == "in_place"
    await engine.resume()
    assert slow_start.paused is None
    await engine.close()


async def test_a_weight_update_waits_for_every_replica_and_names_the_one_that_did_not_answer():
    cluster = Cluster(3)
    engine = cluster.engine(replica_timeout_s=0.05)
    await engine.update_weights({"w": torch.zeros(1)}, version=1)
    cluster.replicas[2].weights_hold.clear()  # never answers
    with pytest.raises(ReplicaTimeoutError, match=r"fake replica 2 did not answer the weight update to version 2 "
                                                   r"within engine.replica_timeout_s=0.05s") as info:
        await engine.update_weights({"w": torch.ones(1)}, version=2)
    assert "fake replica 0" not in str(info.value) and "fake replica 1" not in str(info.value)
    assert engine.weight_version == 1  # not every replica serves version 2
    assert [r.version for r in cluster.replicas] == [2, 2, 1]
    assert isinstance(info.value, EngineError)


async def test_a_health_check_replaces_a_replica_that_does_not_answer():
    cluster = Cluster(2)
    engine = cluster.engine(replica_timeout_s=0.05)
    await engine.update_weights({"w": torch.ones(1)}, version=3)
    cluster.replicas[0].ping_hold.clear()  # hung: alive, but answers nothing
    assert await engine.check_health() == [1]
    assert engine.healthy == [False, True]
    assert "fake replica 0 did not answer the health check" in engine.last_errors[0]
    await until(lambda: all(engine.healthy), "replica 0 replaced")
    assert cluster.replicas[0].dead and engine.replicas[0] is cluster.spawned[0] and cluster.spawned[0].version == 3
    await engine.close()


async def test_a_replica_that_dies_during_a_weight_update_is_restarted_with_those_weights():
    cluster = Cluster(2)
    engine = cluster.engine()
    cluster.replicas[1].kill()
    await engine.update_weights({"w": torch.ones(1)}, version=4)
    assert engine.weight_version == 4
    await until(lambda: all(engine.healthy), "replica 1 restarted")
    assert cluster.spawned[0].version == 4
    await engine.close()


async def test_when_replicas_keep_dying_the_request_fails_as_an_engine_error_naming_them():
    cluster = Cluster(2, spawn_alive=False)  # replacements die too
    engine = cluster.engine(max_replica_retries=1)
    for replica in cluster.replicas:
        replica.kill()
    with pytest.raises(EngineError, match=r"died 2 time\(s\) \(engine.max_replica_retries=1\): "
                                          r"fake replica \d died: killed; fake replica \d died: killed"):
        await engine.generate([1], PARAMS, session_id="a")
    await until(lambda: not engine._restarts, "the replacements failed")
    with pytest.raises(EngineError, match="no engine replica is up and their restarts failed: "
                                          "fake replica 0 did not come back"):
        await engine.generate([1], PARAMS, session_id="b")
    await engine.close()
    assert all(r.dead for r in cluster.replicas)


async def test_close_closes_every_replica_and_later_requests_fail():
    cluster = Cluster(2)
    engine = cluster.engine()
    await engine.close()
    assert all(r.closed and r.dead for r in cluster.replicas)
    with pytest.raises(EngineError, match="closed"):
        await engine.generate([1], PARAMS)


def test_weights_travel_as_arrays_of_their_own_tensor_only():
    from agentrl.inference.replica_actor import pack_weights, unpack_weights

    buffer = torch.arange(64, dtype=torch.uint8)
    embed = buffer[0:16].view(torch.float32).view(2, 2)  # a view into a larger buffer, as shared-memory weights
    state = {"embed": embed, "lm_head": embed, "norm": torch.tensor([1.5, -2.0], dtype=torch.bfloat16)}
    packed = pack_weights(state)
    assert packed["embed"][0].nbytes == 16  # the view's bytes, not the whole buffer's
    back = unpack_weights(packed)
    assert back["norm"].dtype == torch.bfloat16 and torch.equal(back["norm"], state["norm"])
    assert torch.equal(back["embed"], embed) and torch.equal(back["lm_head"], embed)
