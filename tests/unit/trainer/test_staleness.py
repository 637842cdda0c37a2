"""Staleness from the weight versions of policy tokens, with hand-computed values: per trajectory, per group
(whole groups dropped beyond max_staleness, and counted), the step metrics; and the batch carries the versions."""

from __future__ import annotations

import pytest

from agentrl.trainer.batch import episodes_to_batch
from agentrl.trainer.staleness import (
    filter_stale_groups,
    spans_update,
    staleness,
    staleness_metrics,
)
from agentrl.types import Episode


def episode(versions: list[int], mask: list[int] | None = None, uid: str = "g") -> Episode:
    """An episode whose response tokens carry `versions` (-1 where the mask, default from the versions, is 0)."""
    mask = mask if mask is not None else [int(v >= 0) for v in versions]
    n = len(mask)
    return Episode(uid=uid, prompt_ids=[1, 2], response_ids=list(range(10, 10 + n)), response_mask=mask,
                   response_logprobs=[-0.5 * m for m in mask], messages=[], response_versions=versions,
                   episode_id=f"{uid}-{len(versions)}")


def test_staleness_is_the_trainer_version_minus_the_oldest_policy_token():
    # turn 0 sampled by 3, an observation (-1), turn 1 by 4 and 5: the oldest is 3, the trainer is at 6
    assert staleness([3, 3, -1, -1, 4, 5], [1, 1, 0, 0, 1, 1], trainer_version=6) == 3
    assert staleness([7, -1, 7], [1, 0, 1], trainer_version=7) == 0
    # mask-0 tokens do not count even when a version is written on them
    assert staleness([0, 5, 5], [0, 1, 1], trainer_version=6) == 1
    assert staleness([], [1, 1], trainer_version=6) is None  # the engine did not say
    assert staleness([-1, -1], [0, 0], trainer_version=6) is None  # no policy token
    with pytest.raises(ValueError, match="policy token 1 has no weight version"):
        staleness([2, -1], [1, 1], trainer_version=6)
    with pytest.raises(ValueError, match="weight version 7, newer than the trainer's version 6"):
        staleness([7], [1], trainer_version=6)
    with pytest.raises(ValueError, match="3 weight versions for 2 mask entries"):
        staleness([1, 1, 1], [1, 1], trainer_version=6)


def test_an_episode_spans_an_update_when_its_policy_tokens_carry_two_versions():
    assert spans_update([3, -1, 4], [1, 0, 1])
    assert spans_update([3, 4], [1, 1])
    assert not spans_update([3, -1, 3], [1, 0, 1])
    assert not spans_update([3, 9], [1, 0])  # the other version is on a mask-0 token
    assert not spans_update([], [1, 1])


def test_groups_beyond_max_staleness_are_dropped_whole_and_counted():
    fresh = [episode([5, 5]), episode([4, -1, 5])]  # staleness 0 and 1 at trainer version 5
    one_old = [episode([5]), episode([3, 4])]  # its stalest episode is 2 behind
    very_old = [episode([1]), episode([1])]  # 4 behind
    empty = [episode([-1], mask=[0])]  # no policy token: nothing stale
    groups = [fresh, one_old, very_old, empty]
    kept, dropped = filter_stale_groups(groups, max_staleness=2, trainer_version=5)
    assert kept == [fresh, one_old, empty] and dropped == 1
    kept, dropped = filter_stale_groups(groups, max_staleness=1, trainer_version=5)
    assert kept == [fresh, empty] and dropped == 2
    kept, dropped = filter_stale_groups(groups, max_staleness=0, trainer_version=5)
    assert kept == [empty] and dropped == 3  # the fresh group holds a token one version behind
    assert filter_stale_groups(groups, max_staleness=4, trainer_version=5) == (groups, 0)
    with pytest.raises(ValueError, match="episode g-0 has no weight versions"):
        filter_stale_groups([[episode([], mask=[1, 1])]], max_staleness=2, trainer_version=5)
    with pytest.raises(ValueError, match="max_staleness must be >= 0"):
        filter_stale_groups(groups, max_staleness=-1, trainer_version=5)


def test_step_metrics_histogram_mean_max_and_spanning_episodes():
    eps = [episode([6, 6]), episode([6, -1, 6]), episode([4, -1, 6]), episode([5, 6]), episode([3]),
           episode([], mask=[1]), episode([-1], mask=[0])]
    # staleness at trainer version 6: 0, 0, 2, 1, 3; one episode unversioned, one without policy tokens
    assert staleness_metrics(eps, 6) == {
        "rollout/episodes_spanning_update": 2.0, "rollout/unversioned_episodes": 1.0,
        "rollout/staleness_mean": pytest.approx(6 / 5), "rollout/staleness_max": 3.0,
        "rollout/staleness_hist/0": 2.0, "rollout/staleness_hist/1": 1.0, "rollout/staleness_hist/2": 1.0,
        "rollout/staleness_hist/3": 1.0}
    assert staleness_metrics(eps, None) == {"rollout/episodes_spanning_update": 2.0}  # no trainer version known
    assert staleness_metrics([episode([], mask=[1])], 6) == {"rollout/episodes_spanning_update": 0.0,
                                                             "rollout/unversioned_episodes": 1.0}
    sync = staleness_metrics([episode([2, -1, 2]), episode([2])], 2)  # sync mode: one version, the trainer's
    assert sync["rollout/staleness_max"] == 0 and sync["rollout/staleness_hist/0"] == 2
    assert sync["rollout/episodes_spanning_update"] == 0


def test_the_batch_carries_the_versions_on_policy_tokens_only():
    eps = [episode([3, -1, 4]), episode([5, 5]), episode([], mask=[1, 1])]
    eps[0].response_versions[1] = 9  # a version written on a mask-0 token is not a policy token's
    batch = episodes_to_batch(eps, pad_token_id=0)
    assert batch["weight_versions"].dtype == batch["input_ids"].dtype
    assert batch["weight_versions"].shape == batch["loss_mask"].shape == (3, 5)
    assert batch["weight_versions"].tolist() == [[-1, -1, 3, -1, 4], [-1, -1, 5, 5, -1], [-1, -1, -1, -1, -1]]
    with pytest.raises(ValueError, match="len\\(response_versions\\)=1 != len\\(response_ids\\)=2"):
        episodes_to_batch([episode([3], mask=[1, 1])], pad_token_id=0)
