"""The loop's algorithm wiring without models: DAPO overlong scores, truncated responses out of the loss,
rollout correction weights and rejection computed for the batch, lone episodes are not zero-variance groups."""

from __future__ import annotations

import pytest
import torch
from test_loop import ScriptedRollout, task

from agentrl.config import load_config
from agentrl.trainer.batch import episodes_to_batch
from agentrl.trainer.config import TrainConfig
from agentrl.trainer.loop import (
    TaskSampler,
    collect_episodes,
    episode_scores,
    mask_truncated,
    needs_reference,
    rollout_correction,
)
from agentrl.types import Episode


def cfg(*overrides: str) -> TrainConfig:
    return load_config(TrainConfig, None, ["data.train_batch_size=2", "rollout.n=2", "actor.ppo_mini_batch_size=1",
                                           "agent.max_response_tokens=10", *overrides])


def episode(response: int, reward: float = 1.0, finish: str = "stop") -> Episode:
    return Episode(uid="g", prompt_ids=[1, 2], response_ids=[3] * response, response_mask=[1] * response,
                   response_logprobs=[-1.0] * response, messages=[], reward=reward, finish_reason=finish)


def test_overlong_buffer_lowers_the_scores_of_long_responses():
    eps = [episode(5), episode(8), episode(10)]
    scores, stats = episode_scores(eps, cfg())
    assert scores.tolist() == [1.0, 1.0, 1.0] and stats == {}
    scores, stats = episode_scores(eps, cfg("reward.overlong_buffer.enable=true", "reward.overlong_buffer.len=4",
                                            "reward.overlong_buffer.penalty_factor=1.0"))
    assert scores.tolist() == pytest.approx([1.0, 0.5, 0.0])  # penalty from 6 tokens, -1 at the budget of 10
    assert stats["reward/overlong_frac"] == pytest.approx(2 / 3)
    assert eps[2].reward == 1.0  # the episode's own reward is left as scored


def test_truncated_responses_are_counted_and_masked_only_when_asked():
    eps = [episode(3), episode(3, finish="length"), episode(3, finish="max_turns")]
    loss_mask = episodes_to_batch(eps, 0)["loss_mask"]
    kept, stats = mask_truncated(loss_mask, eps, enabled=False)
    assert stats == {"data/truncated_frac": pytest.approx(1 / 3)}
    assert kept.sum() == 9
    kept, stats = mask_truncated(loss_mask, eps, enabled=True)
    assert stats["data/masked_truncated"] == 1
    assert kept.sum(1).tolist() == [3, 0, 3]
    assert loss_mask.sum() == 9  # the batch's own mask is left as it was


def test_rollout_correction_puts_weights_in_the_batch_and_rejects_from_the_mask():
    eps = [episode(2), episode(2)]
    batch = episodes_to_batch(eps, 0)
    batch["old_logprobs"] = batch["rollout_logprobs"].clone()
    batch["old_logprobs"][1, 2:4] += torch.tensor([2.0, 0.0])  # pi_old / pi_rollout = e^2 on one token
    off = load_config(TrainConfig, None, []).algorithm.rollout_correction
    assert rollout_correction(batch, off) == ({}, {})
    tis = cfg("algorithm.rollout_correction.level=token", "algorithm.rollout_correction.threshold=2.0")
    tensors, stats = rollout_correction(batch, tis.algorithm.rollout_correction)
    assert list(tensors) == ["rollout_is_weights"]
    assert tensors["rollout_is_weights"][1, 2:4].tolist() == pytest.approx([2.0, 1.0])  # truncated at 2
    assert tensors["rollout_is_weights"][:, :2].abs().sum() == 0  # prompt tokens get no weight
    assert stats["rollout_corr/corrected_frac"] == pytest.approx(0.25)
    reject = cfg("algorithm.rollout_correction.rejection.level=sequence",
                 "algorithm.rollout_correction.rejection.lower=0.5",
                 "algorithm.rollout_correction.rejection.upper=2.0")
    tensors, stats = rollout_correction(batch, reject.algorithm.rollout_correction)
    assert list(tensors) == ["loss_mask"] and tensors["loss_mask"].sum(1).tolist() == [2, 0]
    assert stats["rollout_corr/rejected_seq_frac"] == 0.5
    assert batch["loss_mask"].sum(1).tolist() == [2, 2] and "rollout_is_weights" not in batch.keys()  # unchanged


def test_the_reference_is_loaded_for_either_kl():
    assert not needs_reference(cfg())
    assert needs_reference(cfg("actor.use_kl_loss=true"))
    assert needs_reference(cfg("algorithm.use_kl_in_reward=true"))


async def test_lone_episodes_are_not_zero_variance_groups():
    tasks = [task("a", [1.0]), task("b", [0.0])]
    one = cfg("rollout.n=1")
    episodes, stats, _ = await collect_episodes(ScriptedRollout(1), TaskSampler(tasks, 2, shuffle=False, seed=0),
                                                one, step=1)
    assert len(episodes) == 2
    assert stats["data/signal_groups"] == 0 and "data/zero_var_groups" not in stats
