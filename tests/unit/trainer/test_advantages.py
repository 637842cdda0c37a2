"""Advantage estimators, token rewards and overlong shaping against hand-computed numbers
(verl's `core_algos.py` formulas)."""

from __future__ import annotations

import pytest
import torch

from agentrl.trainer.algos import (
    ADV_ESTIMATORS,
    AdvantageInputs,
    gae_advantages,
    masked_whiten,
    overlong_penalty,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    resolve_adv_estimator,
    rloo_advantages,
    token_level_rewards,
)

F64 = torch.float64


def t(values) -> torch.Tensor:
    return torch.tensor(values, dtype=F64)


def gae_by_hand(rewards, values, mask, gamma, lam):
    """Plain-python GAE over the policy tokens of each row, the observation tokens (mask 0) left out."""
    adv = [[0.0] * len(row) for row in rewards]
    for i, (r, v, m) in enumerate(zip(rewards, values, mask)):
        steps = [k for k, keep in enumerate(m) if keep]
        last, next_v = 0.0, 0.0
        for k in reversed(steps):
            delta = r[k] + gamma * next_v - v[k]
            last = delta + gamma * lam * last
            next_v = v[k]
            adv[i][k] = last
        for k in range(len(m)):  # mask-0 tokens carry the advantage of the next policy token
            if not m[k]:
                later = [s for s in steps if s > k]
                adv[i][k] = adv[i][later[0]] if later else 0.0
    return adv


def test_token_level_rewards_put_the_score_on_the_last_policy_token():
    mask = t([[1, 1, 0, 0], [1, 0, 1, 0], [0, 0, 0, 0]])
    out = token_level_rewards(t([1.0, -2.0, 5.0]), mask)
    assert out.tolist() == [[0, 1.0, 0, 0], [0, 0, -2.0, 0], [0, 0, 0, 0]]


def test_gae_single_turn_by_hand():
    # one row, 3 policy tokens, reward 1 at the end, gamma 1, lam 0.5
    r, v, m = t([[0, 0, 1.0]]), t([[0.5, 0.2, 0.4]]), t([[1, 1, 1]])
    adv, ret = gae_advantages(r, v, m, gamma=1.0, lam=0.5)
    # t=2: delta = 1 - 0.4 = 0.6 -> A2 = 0.6; t=1: delta = 0 + 0.4 - 0.2 = 0.2 -> A1 = 0.2 + 0.5*0.6 = 0.5
    # t=0: delta = 0.2 - 0.5 = -0.3 -> A0 = -0.3 + 0.5*0.5 = -0.05
    raw = t([[-0.05, 0.5, 0.6]])
    assert torch.allclose(ret, raw + v)
    assert torch.allclose(adv, masked_whiten(raw, m))
    assert torch.allclose(adv, (raw - raw.mean()) / raw.std(), atol=1e-6)  # unbiased variance


def test_gae_skips_observation_spans_like_a_loop_over_policy_tokens():
    torch.manual_seed(0)
    mask = t([[1, 1, 0, 0, 1, 1, 0, 1, 0, 0], [1, 0, 0, 1, 1, 1, 1, 0, 0, 0], [0, 1, 1, 0, 1, 0, 0, 0, 0, 0]])
    values = torch.randn(3, 10, dtype=F64)
    rewards = token_level_rewards(t([1.0, -0.5, 2.0]), mask) + 0.1 * torch.randn(3, 10, dtype=F64) * mask
    adv, ret = gae_advantages(rewards, values, mask, gamma=0.9, lam=0.8)
    raw = t(gae_by_hand(rewards.tolist(), values.tolist(), mask.tolist(), 0.9, 0.8))
    assert torch.allclose(ret, (raw + values) * mask)
    assert torch.allclose(adv, masked_whiten(raw, mask))
    assert (adv[mask == 0] == 0).all() and (ret[mask == 0] == 0).all()
    # an observation span is not a step: the advantage equals that of the same row without the span
    keep = mask[0].bool()
    packed, _ = gae_advantages(rewards[:1, keep], values[:1, keep], torch.ones(1, int(keep.sum()), dtype=F64), 0.9, 0.8)
    raw_row = raw[:1, keep]
    assert torch.allclose(raw_row, t(gae_by_hand(rewards[:1, keep].tolist(), values[:1, keep].tolist(),
                                                 [[1] * int(keep.sum())], 0.9, 0.8)))
    assert packed.shape == raw_row.shape


def test_gae_with_lam_1_gamma_1_is_return_minus_value():
    r, v, m = t([[0, 0, 2.0], [0, 1.0, 0]]), t([[0.1, 0.2, 0.3], [0.4, 0.5, 0.0]]), t([[1, 1, 1], [1, 1, 0]])
    _, ret = gae_advantages(r, v, m, gamma=1.0, lam=1.0)
    assert torch.allclose(ret, t([[2.0, 2.0, 2.0], [1.0, 1.0, 0.0]]))


def test_gae_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match=r"one \[B, T\] shape"):
        gae_advantages(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3), 1.0, 1.0)


def test_rloo_is_score_minus_mean_of_the_others_and_a_singleton_keeps_its_score():
    adv = rloo_advantages(t([1.0, 0.0, 0.0, 3.0, 7.0]), ["a", "a", "a", "b", "c"])
    # group a: n=3, mean 1/3: 1*1.5 - 0.5 = 1.0 (= 1 - mean(0, 0)); 0 - mean(1, 0) = -0.5; singletons b, c raw
    assert torch.allclose(adv, t([1.0, -0.5, -0.5, 3.0, 7.0]))


def test_reinforce_pp_returns_carry_across_observation_spans():
    r = t([[0.0, 0.0, 0.0, 1.0, 0.0]])
    m = t([[1, 0, 0, 1, 0]])
    adv, ret = reinforce_pp_advantages(r, m, gamma=0.5)
    # t=3: G = 1; t=1,2 mask 0 carry; t=0: G = 0 + 0.5 * 1 = 0.5
    assert torch.allclose(ret, t([[0.5, 0, 0, 1.0, 0]]))
    assert torch.allclose(adv, masked_whiten(ret, m))


def test_reinforce_pp_baseline_centres_per_group_then_whitens():
    m = t([[1, 1, 0], [1, 0, 0], [1, 1, 1]])
    adv = reinforce_pp_baseline_advantages(t([1.0, 0.0, 4.0]), ["g", "g", "solo"], m)
    centered = t([[0.5, 0.5, 0], [-0.5, 0, 0], [4.0, 4.0, 4.0]])
    assert torch.allclose(adv, masked_whiten(centered, m))


def test_every_estimator_has_one_calling_convention():
    m = t([[1, 1, 0], [1, 0, 1], [1, 1, 1], [0, 1, 1]])
    x = AdvantageInputs(token_rewards_B_T=token_level_rewards(t([1.0, 0.0, 2.0, 1.0]), m), mask_B_T=m,
                        group_ids=["a", "a", "b", "b"], values_B_T=torch.zeros(4, 3, dtype=F64), gamma=1.0, lam=0.9)
    for name, estimator in ADV_ESTIMATORS.items():
        adv, ret = estimator(x)
        assert adv.shape == m.shape, name
        assert (adv[m == 0] == 0).all(), name
        assert ret is None or ret.shape == m.shape, name
    grpo, _ = ADV_ESTIMATORS["grpo"](x)
    assert torch.allclose(grpo[0, 0], -grpo[1, 0]) and grpo[0, 0] > 0
    dr, _ = ADV_ESTIMATORS["grpo"](AdvantageInputs(**{**x.__dict__, "norm_adv_by_std_in_grpo": False}))
    assert torch.allclose(dr[:, 0], t([0.5, -0.5, 0.5, 0.0]))
    with pytest.raises(ValueError, match="enable the critic"):
        ADV_ESTIMATORS["gae"](AdvantageInputs(x.token_rewards_B_T, m, x.group_ids))


def _my_estimator(inputs):
    return inputs.mask_B_T * 2.0, None


def _bad_estimator(a, b):
    return a, b


def test_resolve_adv_estimator_escape_hatch():
    assert resolve_adv_estimator("rloo") is ADV_ESTIMATORS["rloo"]
    fn = resolve_adv_estimator(f"{__name__}:_my_estimator")
    assert fn is _my_estimator
    with pytest.raises(ValueError, match="must accept one argument"):
        resolve_adv_estimator(f"{__name__}:_bad_estimator")
    with pytest.raises(ValueError, match="unknown; choose one of gae, grpo"):
        resolve_adv_estimator("ppo")


def test_overlong_penalty_is_linear_over_the_buffer():
    out = overlong_penalty([10, 16, 18, 20], max_len=20, buffer_len=4, penalty_factor=1.0)
    assert torch.allclose(out, torch.tensor([0.0, 0.0, -0.5, -1.0]))
    assert overlong_penalty(torch.tensor([20]), 20, 4, 0.5).item() == pytest.approx(-0.5)
    with pytest.raises(ValueError, match="buffer_len"):
        overlong_penalty([1], 10, 0, 1.0)


@pytest.mark.parametrize("name", ["grpo", "rloo", "reinforce_plus_plus_baseline"])
def test_a_split_episode_counts_once_in_its_group(name):
    """Group g holds episodes a (split in two parts, score 1), b (0) and c (0): the estimator sees three members,
    and both parts of a get a's advantage, the same as for the unsplit group."""
    mask = torch.ones(4, 2, dtype=F64)
    rewards = t([[0, 1], [0, 1], [0, 0], [0, 0]])
    split = ADV_ESTIMATORS[name](AdvantageInputs(rewards, mask, ["g"] * 4, episode_ids=["a", "a", "b", "c"]))[0]
    whole = ADV_ESTIMATORS[name](AdvantageInputs(rewards[1:], mask[1:], ["g"] * 3))[0]
    if name == "grpo":  # by hand: scores 1, 0, 0; mean 1/3, std (Bessel) 1/sqrt(3)
        assert whole[0, 0].item() == pytest.approx((2 / 3) / (1 / 3 ** 0.5), rel=1e-5)
    if name == "rloo":  # 1 - mean(0, 0) and 0 - mean(1, 0)
        assert whole[:, 0].tolist() == pytest.approx([1.0, -0.5, -0.5])
    if name == "reinforce_plus_plus_baseline":  # whitened over the batch's tokens: 4 rows of a's now weigh more
        assert split[0].tolist() == split[1].tolist() and split[0, 0] > 0 > split[2, 0] == split[3, 0]
        return
    assert split[0].tolist() == split[1].tolist() == whole[0].tolist()
    assert split[2:].tolist() == whole[1:].tolist()
    unsplit = ADV_ESTIMATORS[name](AdvantageInputs(rewards, mask, ["g"] * 4))[0]  # four members: a counted twice
    assert unsplit[0, 0] != whole[0, 0]


def test_split_episode_ids_join_the_parts_and_keep_other_episodes_apart():
    from agentrl.agent_loop.calls import split_episode_ids
    from agentrl.types import Episode

    def ep(uid, episode_id, part=None):
        return Episode(uid=uid, prompt_ids=[1], response_ids=[2], response_mask=[1], response_logprobs=[0.0],
                       messages=[], episode_id=episode_id,
                       metrics={} if part is None else {"sample_part": part})

    eps = [ep("g", "g-0", 0), ep("g", "g-0-part1", 1), ep("g", "g-1"), ep("g", ""), ep("g", ""), ep("h", "g-0")]
    assert split_episode_ids(eps) == ["g/g-0", "g/g-0", "g/g-1", "g/#3", "g/#4", "h/g-0"]
