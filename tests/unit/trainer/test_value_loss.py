"""The critic's clipped value loss: the numbers of "Policy 与 Value Update", §8.1,
micro-batch invariance and gradients."""

from __future__ import annotations

import pytest
import torch

from agentrl.trainer.algos import AGG_MODES, value_loss

F64 = torch.float64


def t(values) -> torch.Tensor:
    return torch.tensor(values, dtype=F64)


def test_seed_example_clipped_value_loss_is_0_08():
    loss, clipfrac = value_loss(t([[0.9]]), t([[1.0]]), t([[0.4]]), torch.ones(1, 1), cliprange_value=0.2)
    assert loss.item() == pytest.approx(0.08)  # 0.5 * max(0.01, (0.6 - 1.0)^2 = 0.16)
    assert clipfrac.item() == 1.0
    loss, clipfrac = value_loss(t([[0.5]]), t([[1.0]]), t([[0.4]]), torch.ones(1, 1), cliprange_value=0.2)
    assert loss.item() == pytest.approx(0.5 * 0.25) and clipfrac.item() == 0.0  # inside the band


def test_value_loss_gradient_matches_the_analytic_one():
    vpred = t([[0.9, 0.5, -0.3, 2.0]]).requires_grad_()
    ret, old, mask = t([[1.0, 1.0, 0.0, 0.0]]), t([[0.4, 0.4, 0.0, 0.0]]), t([[1, 1, 1, 0]])
    loss, _ = value_loss(vpred, ret, old, mask, cliprange_value=0.2)
    loss.backward()
    # token 0: clipped branch wins (vclip constant 0.6) -> no gradient; token 1: (vpred - R) / N with N = 3;
    # token 2: |vpred| = 0.3 > 0.2, clipped loss (0.2^2) < unclipped (0.3^2) -> unclipped gradient; token 3 masked
    assert torch.allclose(vpred.grad, t([[0.0, (0.5 - 1.0) / 3, (-0.3 - 0.0) / 3, 0.0]]))
    x = t([[0.3, 0.7]]).requires_grad_()
    assert torch.autograd.gradcheck(lambda v: value_loss(v, t([[1.0, 0.2]]), t([[0.25, 0.6]]), torch.ones(1, 2),
                                                         0.2)[0], (x,))


@pytest.mark.parametrize("mode", AGG_MODES)
def test_value_loss_is_micro_batch_invariant_with_global_counts(mode):
    torch.manual_seed(0)
    B, T = 6, 7
    mask = (torch.rand(B, T) > 0.3).to(F64)
    mask[2] = 0  # an all-masked row still counts as a trajectory
    vpred, ret, old = torch.randn(B, T, dtype=F64), torch.randn(B, T, dtype=F64), torch.randn(B, T, dtype=F64)
    kw = {"num_tokens": int(mask.sum()), "num_seqs": B, "scale_factor": 7.0}
    whole, _ = value_loss(vpred, ret, old, mask, 0.3, mode, **kw)
    parts = sum(value_loss(vpred[s], ret[s], old[s], mask[s], 0.3, mode, **kw)[0]
                for s in (slice(0, 1), slice(1, 4), slice(4, 6)))
    assert torch.allclose(whole, parts)
    # without the global counts token-mean would weight the micro-batches differently
    if mode == "token-mean":
        local = sum(value_loss(vpred[s], ret[s], old[s], mask[s], 0.3, mode)[0] for s in (slice(0, 1), slice(1, 6)))
        assert not torch.allclose(whole, local / 2)
