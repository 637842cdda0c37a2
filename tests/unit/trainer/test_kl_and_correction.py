"""Reward-side KL, its controllers, and rollout correction (TIS / IcePop / rejection) by hand."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.trainer.algos import (
    AdaptiveKLController,
    FixedKLController,
    apply_kl_in_reward,
    make_kl_controller,
    rollout_is_weights,
    rollout_rejection_mask,
    token_level_rewards,
)

F64 = torch.float64


def t(values) -> torch.Tensor:
    return torch.tensor(values, dtype=F64)


def test_adaptive_kl_controller_sequence():
    ctrl = AdaptiveKLController(init_kl_coef=0.1, target_kl=0.05, horizon=100)
    ctrl.update(current_kl=0.1, n_steps=10)  # err = clip(2 - 1) = 0.2 -> beta *= 1.02
    assert ctrl.value == pytest.approx(0.102)
    ctrl.update(current_kl=0.04, n_steps=10)  # err = -0.2 -> *= 0.98
    assert ctrl.value == pytest.approx(0.102 * 0.98)
    ctrl.update(current_kl=0.05, n_steps=50)  # on target: unchanged
    assert ctrl.value == pytest.approx(0.102 * 0.98)
    ctrl.update(current_kl=0.055, n_steps=50)  # err = 0.1 -> *= 1.05
    assert ctrl.value == pytest.approx(0.102 * 0.98 * 1.05)
    state = ctrl.state_dict()
    again = make_kl_controller("adaptive", 0.5, 0.05, 100)
    again.load_state_dict(state)
    assert again.value == ctrl.value


def test_fixed_kl_controller_never_moves():
    ctrl = make_kl_controller("fixed", 0.001)
    assert isinstance(ctrl, FixedKLController) and not isinstance(ctrl, AdaptiveKLController)
    ctrl.update(10.0, 1000)
    assert ctrl.value == 0.001
    with pytest.raises(ValueError, match="fixed' or 'adaptive"):
        make_kl_controller("pid", 0.1)


def test_reward_side_kl_on_policy_tokens_and_its_metrics():
    mask = t([[1, 1, 0], [1, 0, 0]])
    scores = token_level_rewards(t([1.0, 0.0]), mask)
    old, ref = t([[-1.0, -1.0, -5.0], [-0.5, 0.0, 0.0]]), t([[-1.2, -0.8, 0.0], [-1.0, 0.0, 0.0]])
    rewards, m = apply_kl_in_reward(scores, old, ref, mask, kl_coef=0.5, kind="kl")
    # k1 = old - ref: row 0 [0.2, -0.2], row 1 [0.5]
    assert torch.allclose(rewards, t([[-0.1, 1.0 + 0.1, 0.0], [-0.25, 0.0, 0.0]]))
    assert m["actor/reward_kl_penalty"] == pytest.approx((0.0 + 0.5) / 2)  # per-row means, then rows
    assert m["actor/reward_kl_penalty_coeff"] == 0.5


def test_tis_truncates_token_weights_and_reports_metrics():
    log_ratio = torch.log(t([[1.0, 3.0, 0.25, 7.0]]))
    mask = t([[1, 1, 1, 0]])
    w, m = rollout_is_weights(log_ratio, mask, "token", 2.0)
    assert torch.allclose(w, t([[1.0, 2.0, 0.25, 0.0]]))
    assert m["rollout_corr/weight_max"] == pytest.approx(3.0) and m["rollout_corr/weight_min"] == pytest.approx(0.25)
    assert m["rollout_corr/weight_mean"] == pytest.approx((1 + 3 + 0.25) / 3)
    assert m["rollout_corr/ess"] == pytest.approx(3.25 ** 2 / (3 * (1 + 4 + 0.0625)))
    assert m["rollout_corr/corrected_frac"] == pytest.approx(1 / 3)
    assert not w.requires_grad


def test_icepop_masks_weights_outside_the_band():
    log_ratio = torch.log(t([[1.0, 3.0, 0.25, 0.6]]))
    w, m = rollout_is_weights(log_ratio, torch.ones(1, 4, dtype=F64), "token", (0.5, 2.0))
    assert torch.allclose(w, t([[1.0, 0.0, 0.0, 0.6]]))
    assert m["rollout_corr/corrected_frac"] == pytest.approx(0.5)
    w2, _ = rollout_is_weights(log_ratio, torch.ones(1, 4, dtype=F64), "token", 2.0, mode="mask")
    assert torch.equal(w, w2)  # a number U with mode mask means [1/U, U]


def test_sequence_level_weight_is_the_product_over_policy_tokens():
    log_ratio = t([[0.1, 0.3, 9.0], [0.9, 5.0, -0.6]])
    mask = t([[0, 1, 1], [1, 0, 1]])  # row 0's first token is an observation
    w, m = rollout_is_weights(log_ratio, mask, "sequence", 2.0)
    assert torch.allclose(w, t([[0.0, 2.0, 2.0], [math.exp(0.3), 0.0, math.exp(0.3)]]))
    assert m["rollout_corr/weight_max"] == pytest.approx(math.exp(9.3))
    assert m["rollout_corr/corrected_frac"] == pytest.approx(0.5)  # one of two trajectories truncated


def test_rejection_masks_tokens_or_whole_trajectories():
    log_ratio = torch.log(t([[1.0, 3.0, 1.0], [1.1, 1.1, 1.1]]))
    mask = t([[1, 1, 1], [1, 1, 0]])
    kept, m = rollout_rejection_mask(log_ratio, mask, "token", 0.5, 2.0)
    assert torch.equal(kept, t([[1, 0, 1], [1, 1, 0]]))
    assert m["rollout_corr/rejected_frac"] == pytest.approx(1 / 5) and m["rollout_corr/rejected_seq_frac"] == 0.5
    kept, _ = rollout_rejection_mask(log_ratio, mask, "sequence", 0.5, 1.2)  # products 3.0 and 1.21
    assert torch.equal(kept, t([[0, 0, 0], [0, 0, 0]]))
    kept, _ = rollout_rejection_mask(log_ratio, mask, "geometric", 0.5, 1.2)  # 3^(1/3) = 1.44, 1.1
    assert torch.equal(kept, t([[0, 0, 0], [1, 1, 0]]))
    with pytest.raises(ValueError, match="0 < lower < upper"):
        rollout_rejection_mask(log_ratio, mask, "token", 2.0, 1.0)
