"""`engine.replicas: 2` for real: two LocalEngines in Ray actors behind `make_engine`'s ReplicatedEngine. They
answer as one LocalEngine does, a weight update reaches both, and a replica killed while it holds requests loses
none of them: they finish on the other one, and the killed one comes back serving the current weights."""

from __future__ import annotations

import asyncio
import time

import pytest
import ray
import torch
from helpers import forcing_weights

from agentrl.inference import EngineConfig, PromptTooLongError, make_engine
from agentrl.inference.local import LocalEngine
from agentrl.inference.replicas import ReplicatedEngine
from agentrl.types import SamplingParams

pytestmark = pytest.mark.slow

GREEDY = SamplingParams(max_new_tokens=12, temperature=0)
PROMPTS = [[17 + i, 402, 96, 1203 + 7 * i, 58, 77] for i in range(8)]


@pytest.fixture(scope="module")
def replicated(tiny_model_dir):
    """Two single-thread replicas of the tiny model on a local Ray of this module's own."""
    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False)
    engine = make_engine(EngineConfig(replicas=2, max_batch_size=8, replica_timeout_s=120), str(tiny_model_dir))
    yield engine
    asyncio.run(engine.close())
    if started:
        ray.shutdown()


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


async def _generate_all(engine, prompts=PROMPTS, session="ep"):
    return await asyncio.gather(*[engine.generate(p, GREEDY, session_id=f"{session}{i}")
                                  for i, p in enumerate(prompts)])


async def test_two_replicas_answer_as_one_local_engine(replicated, model, tiny_model_dir):
    assert isinstance(replicated, ReplicatedEngine)
    assert replicated.max_model_len == model.config.max_position_embeddings
    assert replicated.tokenizer is not None
    await replicated.update_weights(model.state_dict(), version=1)  # the model's own weights, whatever ran before
    local = LocalEngine.from_pretrained(tiny_model_dir, EngineConfig(max_batch_size=8, num_threads=1))
    try:
        expected = await _generate_all(local)
    finally:
        await local.close()
    got = await _generate_all(replicated)
    assert [g.token_ids for g in got] == [e.token_ids for e in expected]
    for g, e in zip(got, expected):
        assert g.logprobs == pytest.approx(e.logprobs, abs=1e-4)
        assert g.weight_versions == [1] * len(g.token_ids)
    assert {g.metrics["replica"] for g in got} == {0, 1}  # both served
    # every turn of an episode stays on its replica
    again = await _generate_all(replicated, [p + g.token_ids for p, g in zip(PROMPTS, got)])
    assert [a.metrics["replica"] for a in again] == [g.metrics["replica"] for g in got]
    # a request's own error comes back as the replica's engine raised it, not as a replica fault
    with pytest.raises(PromptTooLongError, match="shorten the prompt or raise engine.max_model_len"):
        await replicated.generate([5] * replicated.max_model_len, GREEDY, session_id="too-long")
    assert replicated.metrics()["engine/replica_retries"] == 0


async def test_a_weight_update_reaches_every_replica(replicated, model):
    before = await _generate_all(replicated)
    forcing, forced = forcing_weights(model, {t for g in before for t in g.token_ids})
    version = replicated.weight_version + 1
    await replicated.update_weights(forcing, version=version)
    assert replicated.weight_version == version
    stats = await replicated.replica_stats()
    assert sorted(stats) == [0, 1] and all(s["weight_version"] == version for s in stats.values())
    after = await _generate_all(replicated)
    assert {g.metrics["replica"] for g in after} == {0, 1}
    for g in after:
        assert g.token_ids == [forced] * len(g.token_ids) and g.weight_versions == [version] * len(g.token_ids)


async def test_a_killed_replica_loses_no_request_and_comes_back_on_the_current_weights(replicated, model):
    version = replicated.weight_version + 1
    await replicated.update_weights(model.state_dict(), version=version)
    old = replicated.replicas[0]
    old_pid = old.info["pid"]
    # both replicas hold their requests (paused behind the engine's back), so 3 are in flight on each
    ray.get([r.actor.pause.remote("in_place") for r in replicated.replicas])
    requests = [asyncio.ensure_future(replicated.generate(p, GREEDY, session_id=f"kill-ep{i}"))
                for i, p in enumerate(PROMPTS[:6])]
    for _ in range(10_000):
        if replicated.router.in_flight == [3, 3]:
            break
        await asyncio.sleep(0)
    assert replicated.router.in_flight == [3, 3]
    retries_before = replicated.metrics()["engine/replica_retries"]
    ray.kill(old.actor)
    ray.get(replicated.replicas[1].actor.resume.remote())
    gens = await asyncio.gather(*requests)
    assert all(g.finish_reason in ("stop", "length") and g.token_ids for g in gens)
    assert sum(1 for g in gens if g.metrics.get("replica_retries")) == 3
    assert replicated.metrics()["engine/replica_retries"] - retries_before == 3
    # the replacement starts, loads the current weights, then takes requests again
    deadline = time.monotonic() + 120
    while not all(replicated.healthy) and time.monotonic() < deadline:
        await asyncio.sleep(0.25)
    assert all(replicated.healthy), replicated.last_errors
    new = replicated.replicas[0]
    assert new is not old and new.info["pid"] != old_pid
    assert (await replicated.replica_stats())[0]["weight_version"] == version
    fresh = await _generate_all(replicated, PROMPTS[:2], session="fresh-ep")
    assert {g.metrics["replica"] for g in fresh} == {0, 1}
    assert all(g.weight_versions == [version] * len(g.token_ids) for g in fresh)
