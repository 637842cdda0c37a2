"""Engine replicas on a simulated two-node Ray cluster (`ray.cluster_utils.Cluster`, both nodes on this host): each
node offers one `engine_slot`, each replica asks for one (`engine.replica_resources`), so Ray places the two
replicas on different nodes, and requests reach both."""

from __future__ import annotations

import asyncio

import pytest
import ray
from helpers import two_node_ray

from agentrl.inference import EngineConfig, make_engine
from agentrl.types import SamplingParams

pytestmark = pytest.mark.slow


@pytest.fixture
def two_nodes():
    with two_node_ray("engine_slot") as cluster:
        yield cluster


async def test_replicas_that_need_one_slot_each_land_on_different_nodes(two_nodes, tiny_model_dir):
    engine = make_engine(EngineConfig(replicas=2, replica_resources={"engine_slot": 1}, replica_timeout_s=120),
                         str(tiny_model_dir))
    try:
        nodes = {r.info["node_id"] for r in engine.replicas}
        assert len(nodes) == 2
        assert nodes == {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        gens = await asyncio.gather(*[engine.generate([5, 6, 7 + i], SamplingParams(max_new_tokens=4, temperature=0),
                                                      session_id=f"ep{i}") for i in range(4)])
        assert {g.metrics["replica"] for g in gens} == {0, 1}
    finally:
        await engine.close()
