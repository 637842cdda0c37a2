"""Trainer ranks in a Ray placement group on a simulated two-node cluster (`ray.cluster_utils.Cluster`, both nodes
on this host, one CPU and one `trainer_slot` each): `actor.nnodes=2` with SPREAD puts one rank on each node and the
update equals one rank's; a rank whose actor is killed stops the next call with one error naming the rank and its
node; ranks the cluster cannot hold are one error naming the unplaced bundles.

Not under tests/integration/trainer: the simulated cluster needs the process's only Ray, and that directory's
session-wide `ray_session` stays up from its first test to the end of the run (this directory is collected first)."""

from __future__ import annotations

import pytest
import ray
from helpers import two_node_ray

from agentrl.errors import RankDiedError
from agentrl.trainer.batch import episodes_to_batch
from agentrl.trainer.config import ActorConfig, ModelConfig
from agentrl.trainer.fsdp import PlacementError
from agentrl.trainer.worker import WorkerGroup
from agentrl.types import Episode

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def two_nodes():
    with two_node_ray("trainer_slot") as cluster:
        yield cluster


def small_batch():
    rows = [([5, 6, 7, 8], [9, 10, 11], [1, 1, 0]), ([12, 13], [14, 15, 16, 17, 18], [1, 0, 1, 1, 1]),
            ([19, 20, 21], [22, 23], [1, 1])]
    eps = [Episode(uid=f"g{i}", prompt_ids=p, response_ids=r, response_mask=m, response_logprobs=[-5.0] * len(r),
                   messages=[], reward=float(i)) for i, (p, r, m) in enumerate(rows)]
    return episodes_to_batch(eps, pad_token_id=0, advantages=[1.0, -0.5, 0.25])


def one_update(group: WorkerGroup):
    batch = small_batch()
    old, _ = group.compute_logprobs(batch, temperature=1.0)
    batch["old_logprobs"] = old
    return group.update_policy(batch, temperature=1.0, mini_batch_size=3, shuffle=False)


def placed(model: ModelConfig) -> WorkerGroup:
    actor = ActorConfig(lr=1e-3, world_size=2, nnodes=2, workers_per_node=1, placement_strategy="SPREAD",
                        resources_per_worker={"trainer_slot": 1}, grad_clip=1e6, placement_timeout_s=120)
    return WorkerGroup(model, actor, total_steps=2, seed=0)


def test_spread_ranks_land_on_different_nodes_and_update_as_one_rank(two_nodes, tiny_model_dir):
    model = ModelConfig(path=str(tiny_model_dir))
    group = placed(model)
    try:
        node_ids = [node_id for _, node_id in group.rank_nodes]
        assert len(set(node_ids)) == 2
        assert set(node_ids) == {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        two = one_update(group)
    finally:
        group.shutdown()
    single = WorkerGroup(model, ActorConfig(lr=1e-3, world_size=1, grad_clip=1e6), total_steps=2, seed=0)
    try:
        one = one_update(single)
    finally:
        single.shutdown()
    for key in ("pg_loss", "grad_norm"):
        assert two[key] == pytest.approx(one[key], abs=1e-5), key
    assert ray.util.placement_group_table() and all(
        pg["state"] == "REMOVED" for pg in ray.util.placement_group_table().values())


def test_a_killed_rank_stops_the_next_call_with_its_rank_and_node(two_nodes, tiny_model_dir):
    group = placed(ModelConfig(path=str(tiny_model_dir)))
    try:
        address, node_id = group.rank_nodes[1]
        ray.kill(group.workers[1])
        with pytest.raises(RankDiedError) as err:
            group.compute_logprobs(small_batch(), temperature=1.0)
        assert err.value.rank == 1
        assert f"WorkerGroup rank 1 of 2 on node {address} (id {node_id[:12]})" in str(err.value)
        assert "\n" not in str(err.value)
        assert group.workers == []  # rank 0, which waits for rank 1 in a collective, was stopped with it
    finally:
        group.shutdown()


def test_ranks_the_cluster_cannot_hold_name_the_unplaced_bundles(two_nodes, tiny_model_dir):
    actor = ActorConfig(world_size=3, nnodes=3, placement_strategy="STRICT_SPREAD", placement_timeout_s=2)
    with pytest.raises(PlacementError) as err:  # three nodes asked of two: can never be placed
        WorkerGroup(ModelConfig(path=str(tiny_model_dir)), actor, total_steps=2, seed=0)
    message = str(err.value)
    assert "bundles [0, 1, 2] unplaced; the cluster has 2 nodes" in message and "{CPU: 1}" in message
    assert "\n" not in message
    assert all(pg["state"] == "REMOVED" for pg in ray.util.placement_group_table().values())
