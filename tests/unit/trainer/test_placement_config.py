"""The placement keys of a trained model's ranks (`actor.nnodes`, `actor.workers_per_node`): the ranks must fill
the nodes exactly, and the error names both keys."""

from __future__ import annotations

import pytest

from agentrl.config import ConfigError
from agentrl.trainer.config import ActorConfig, CriticConfig, TrainConfig


def test_default_is_one_node_holding_every_rank():
    actor = ActorConfig(world_size=4)
    assert (actor.nnodes, actor.ranks_per_node(), actor.placement_strategy) == (1, 4, "PACK")


def test_workers_per_node_defaults_to_an_even_split():
    assert ActorConfig(world_size=4, nnodes=2).ranks_per_node() == 2
    assert CriticConfig(world_size=6, nnodes=3, workers_per_node=2).ranks_per_node() == 2


@pytest.mark.parametrize("keys", [{"world_size": 3, "nnodes": 2},
                                  {"world_size": 4, "nnodes": 2, "workers_per_node": 1}])
def test_ranks_that_do_not_fill_the_nodes_are_one_line_error(keys):
    with pytest.raises(ConfigError) as err:
        TrainConfig(actor=keys)
    message = str(err.value)
    assert message.startswith("actor: nnodes (2) * workers_per_node")
    assert f"must equal world_size ({keys['world_size']})" in message
    assert "\n" not in message


def test_unknown_strategy_is_rejected():
    with pytest.raises(ConfigError, match="placement_strategy"):
        ActorConfig(world_size=2, nnodes=2, placement_strategy="RANDOM")
