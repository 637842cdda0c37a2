"""Per-turn rewards (an environment's `Episode.turn_rewards`) reach the estimators as token rewards on each turn's
last policy token: GAE and REINFORCE++ read them per token, GRPO their sum. Values computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.config import load_config
from agentrl.trainer.algos import ADV_ESTIMATORS, AdvantageInputs, gae_advantages, reinforce_pp_advantages
from agentrl.trainer.algos.advantages import turn_level_rewards
from agentrl.trainer.batch import episodes_to_batch
from agentrl.trainer.config import TrainConfig
from agentrl.trainer.loop import episode_scores, episode_turn_rewards, step_token_rewards
from agentrl.types import Episode


def test_each_turn_reward_lands_on_the_turn_last_policy_token():
    turn_ids = [0, 0, -1, -1, 1, 1, 1, -1]
    mask = [1, 1, 0, 0, 1, 1, 1, 0]
    assert turn_level_rewards([0.5, -1.0], turn_ids, mask) == [0, 0.5, 0, 0, 0, 0, -1.0, 0]
    assert turn_level_rewards([], turn_ids, mask) == [0.0] * 8
    with pytest.raises(ValueError, match="turn 2 has a reward"):
        turn_level_rewards([0.0, 0.0, 1.0], turn_ids, mask)


def env_episode(uid: str = "g") -> Episode:
    """Prompt [1, 2]; turn 0 = two tokens, one observation token, turn 1 = one token. Turn rewards 0.5 and 1.0,
    outcome 2.0: reward (the whole return) 3.5."""
    return Episode(uid=uid, prompt_ids=[1, 2], response_ids=[3, 4, 5, 6], response_mask=[1, 1, 0, 1],
                   response_logprobs=[-1.0, -1.0, 0.0, -1.0], messages=[], reward=3.5, turn_ids=[0, 0, -1, 1],
                   turn_rewards=[0.5, 1.0])


def outcome_episode(reward: float, uid: str = "g") -> Episode:
    return Episode(uid=uid, prompt_ids=[1, 2], response_ids=[3, 4, 5, 6], response_mask=[1, 1, 0, 1],
                   response_logprobs=[-1.0, -1.0, 0.0, -1.0], messages=[], reward=reward, turn_ids=[0, 0, -1, 1])


def token_rewards(episodes: list[Episode]) -> tuple[torch.Tensor, dict]:
    cfg = load_config(TrainConfig, None, ["data.train_batch_size=2", "actor.ppo_mini_batch_size=1"])
    scores_B, _ = episode_scores(episodes, cfg)
    batch = episodes_to_batch(episodes, pad_token_id=0, token_rewards=episode_turn_rewards(episodes))
    return step_token_rewards(scores_B, batch), batch


def test_the_batch_carries_turn_rewards_and_the_outcome_rest_on_the_last_token():
    rewards_B_L, batch = token_rewards([env_episode(), outcome_episode(1.0)])
    # positions 2..5 are the response; the outcome 2.0 and turn 1's 1.0 share the last policy token
    assert rewards_B_L[0].tolist() == [0, 0, 0, 0.5, 0, 3.0]
    assert rewards_B_L[1].tolist() == [0, 0, 0, 0, 0, 1.0]
    assert batch["rewards"].tolist() == [3.5, 1.0]  # the whole return, as the metrics report it
    assert episode_turn_rewards([outcome_episode(1.0)]) is None  # tool episodes: the batch has no token_rewards


def test_reinforce_pp_discounts_turn_rewards_token_by_token():
    rewards_B_L, batch = token_rewards([env_episode(), outcome_episode(1.0)])
    _, returns = reinforce_pp_advantages(rewards_B_L, batch["loss_mask"], gamma=0.5)
    # walking back over policy tokens, the observation token skipped: G = 3.0; 0.5 + 0.5*3.0 = 2.0; 0.5*2.0
    assert returns[0].tolist() == [0, 0, 1.0, 2.0, 0, 3.0]
    assert returns[1].tolist() == [0, 0, 0.25, 0.5, 0, 1.0]


def test_gae_reads_turn_rewards_token_by_token():
    rewards_B_L, batch = token_rewards([env_episode(), outcome_episode(1.0)])
    values = torch.tensor([[9.0, 9.0, 1.0, 2.0, 7.0, 1.0], [0.0] * 6])  # prompt and observation values unused
    _, returns = gae_advantages(rewards_B_L, values, batch["loss_mask"], gamma=0.9, lam=1.0)
    # t5: delta = 3.0 - 1 = 2.0 -> A 2.0; t3: delta = 0.5 + 0.9*1 - 2 = -0.6 -> A = -0.6 + 0.9*2.0 = 1.2;
    # t2: delta = 0 + 0.9*2 - 1 = 0.8 -> A = 0.8 + 0.9*1.2 = 1.88; returns = A + V
    assert returns[0].tolist() == pytest.approx([0, 0, 2.88, 3.2, 0, 3.0])


def test_grpo_uses_the_sum_of_an_episode_rewards():
    rewards_B_L, batch = token_rewards([env_episode(), outcome_episode(1.0)])
    x = AdvantageInputs(token_rewards_B_T=rewards_B_L, mask_B_T=batch["loss_mask"], group_ids=["g", "g"])
    assert x.scores_B.tolist() == [3.5, 1.0]
    adv, _ = ADV_ESTIMATORS["grpo"](x)
    # mean 2.25, unbiased std sqrt(2 * 1.25^2) = 1.7678: +-0.7071 on every policy token of each episode
    assert adv[0].tolist() == pytest.approx([0, 0, 1 / math.sqrt(2), 1 / math.sqrt(2), 0, 1 / math.sqrt(2)],
                                            abs=1e-5)
    assert adv[1, 5].item() == pytest.approx(-1 / math.sqrt(2), abs=1e-5)
    # a trajectory with the same total as an outcome reward gets the same advantage: GRPO sees only the sum
    outcome_only_B_L, _ = token_rewards([outcome_episode(3.5), outcome_episode(1.0)])
    same, _ = ADV_ESTIMATORS["grpo"](AdvantageInputs(outcome_only_B_L, batch["loss_mask"], ["g", "g"]))
    assert torch.allclose(same, adv)
