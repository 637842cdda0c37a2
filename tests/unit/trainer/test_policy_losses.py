"""The policy-loss family and the total objective against hand-computed numbers and analytic gradients."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.trainer.algos import (
    AGG_MODES,
    POLICY_LOSSES,
    agg_loss,
    kl_penalty,
    policy_loss_cispo,
    policy_loss_clip_cov,
    policy_loss_gspo,
    policy_loss_kl_cov,
    policy_loss_reinforce,
    policy_loss_vanilla,
    ppo_objective,
)

F64 = torch.float64


def t(values) -> torch.Tensor:
    return torch.tensor(values, dtype=F64)


def test_seed_ratio_1_2214_through_every_ratio_loss():
    old, new, one = t([[-1.2]]), t([[-1.0]]), torch.ones(1, 1)
    assert math.exp(0.2) == pytest.approx(1.2214, abs=1e-4)
    # vanilla / clip_cov with eps 0.2: A=+1 -> -min(1.2214, 1.2) = -1.2; A=-1 -> max(1.2214, 1.2) = 1.2214
    for fn in (policy_loss_clip_cov,):
        assert fn(old, new, t([1.0]), one, 0.2, 0.2)[0].item() == pytest.approx(-1.2)
        assert fn(old, new, t([-1.0]), one, 0.2, 0.2)[0].item() == pytest.approx(1.2214, abs=1e-4)
    # gspo of a one-token sequence: s = exp(0.2), the same clipped surrogate
    assert policy_loss_gspo(old, new, t([1.0]), one, 0.2, 0.2)[0].item() == pytest.approx(-1.2)
    # cispo: -sg(clip(1.2214, 0.8, 1.2)) * A * logp = -1.2 * 1 * -1.0 = 1.2
    loss, metrics = policy_loss_cispo(old, new, t([1.0]), one, 0.2, 0.2)
    assert loss.item() == pytest.approx(1.2) and metrics["pg_clipfrac"].item() == 1.0
    # kl_cov: no clip; the only token is the top-covariance one: -A*ratio + 0.1 * |0.2|
    assert policy_loss_kl_cov(old, new, t([1.0]), one)[0].item() == pytest.approx(-math.exp(0.2) + 0.02)


def test_gspo_uses_the_length_normalised_sequence_ratio_and_its_gradient():
    old = t([[-1.0, -2.0, -0.5, 0.0]])
    logp = t([[-0.9, -2.1, -0.3, 5.0]]).requires_grad_()
    mask = t([[1, 1, 1, 0]])
    loss, metrics = policy_loss_gspo(old, logp, t([2.0]), mask, 0.2, 0.2)
    s = math.exp((0.1 - 0.1 + 0.2) / 3)
    assert loss.item() == pytest.approx(-2.0 * s)  # seq-mean-token-mean of -A * s over 3 tokens
    loss.backward()
    # d/dlogp_t of mean_t(-A * r_t) with r_t = s * exp(logp_t - sg(logp_t)): -A * s / |y|
    assert torch.allclose(logp.grad, t([[-2.0 * s / 3] * 3 + [0.0]]))
    assert metrics["pg_clipfrac_lower"].item() == 0.0
    # outside the clip range the clipped branch has no gradient
    logp2 = t([[0.0, 0.0, 0.0, 0.0]]).requires_grad_()
    loss2, m2 = policy_loss_gspo(t([[-0.3, -0.3, -0.3, 0.0]]), logp2, t([1.0]), mask, 3e-4, 4e-4)
    loss2.backward()
    assert loss2.item() == pytest.approx(-(1 + 4e-4)) and (logp2.grad == 0).all() and m2["pg_clipfrac"].item() == 1


def test_gspo_agg_modes_match_vanilla_for_single_token_sequences():
    old, logp, adv, mask = t([[-1.0], [-0.5]]), t([[-1.05], [-0.45]]), t([1.0, -1.0]), torch.ones(2, 1, dtype=F64)
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        g, _ = policy_loss_gspo(old, logp, adv, mask, 0.2, 0.2, mode)
        v, _ = policy_loss_vanilla(logp, old, adv, mask, agg_mode=mode)
        assert torch.allclose(g, v)


def test_cispo_keeps_a_gradient_on_clipped_tokens():
    logp = t([[-0.5, -1.0]]).requires_grad_()
    loss, _ = policy_loss_cispo(t([[-1.5, -1.0]]), logp, t([1.0]), torch.ones(1, 2, dtype=F64), 0.2, 0.2)
    loss.backward()
    # weights sg(clip(e^1, 0.8, 1.2)) = 1.2 and 1.0; token-mean over 2 tokens: d/dlogp = -w * A / 2
    assert torch.allclose(logp.grad, t([[-0.6, -0.5]]))


def test_clip_cov_drops_the_gradient_of_selected_high_covariance_tokens():
    adv = t([[3.0, 3.0, -3.0, -3.0]])
    logp = t([[0.0, -4.0, -4.0, 0.0]]).requires_grad_()
    old = logp.detach().clone()
    mask = torch.ones(1, 4, dtype=F64)
    # means: A 0, logp -2; cov = A * (logp + 2): tokens 0 and 2 have 6 (in (1, 10)), tokens 1 and 3 have -6
    loss, metrics = policy_loss_clip_cov(old, logp, adv, mask, 0.2, 0.2, clip_cov_ratio=0.5, clip_cov_lb=1.0,
                                         clip_cov_ub=10.0, generator=torch.Generator().manual_seed(0))
    loss.backward()
    dropped = logp.grad == 0
    assert int(dropped.sum()) == 2 and bool(dropped[0, 0]) and bool(dropped[0, 2])
    assert metrics["pg_clipfrac"].item() == 0.5
    assert loss.item() == pytest.approx((0 + -3.0 + 0 + 3.0) / 4)


def test_kl_cov_penalises_the_largest_covariance_tokens():
    adv = t([[3.0, 3.0, -3.0, -3.0]])
    old = t([[0.0, -4.0, -4.0, 0.0]])
    logp = (old + t([[0.1, 0.1, -0.1, 0.1]])).requires_grad_()
    loss, metrics = policy_loss_kl_cov(old, logp, adv, torch.ones(1, 4, dtype=F64), kl_cov_ratio=0.25, ppo_kl_coef=1.0)
    ratios = torch.exp(t([0.1, 0.1, -0.1, 0.1]))
    # covariance with logp: token 0 is the largest (3 * (0.1 + 1.975)); it gets + |0.1|
    expected = (-(adv[0] * ratios).sum() + 0.1) / 4
    assert loss.item() == pytest.approx(expected.item())
    assert metrics["pg_clipfrac"].item() == 0.25


def test_reinforce_is_minus_weighted_advantage_times_logp():
    logp = t([[-1.0, -2.0]]).requires_grad_()
    w = t([[2.0, 0.5]])
    loss, metrics = policy_loss_reinforce(t([[-1.0, -1.5]]), logp, t([1.0]), torch.ones(1, 2, dtype=F64),
                                          is_weights=w)
    assert loss.item() == pytest.approx((2.0 * 1.0 + 0.5 * 2.0) / 2)
    loss.backward()
    assert torch.allclose(logp.grad, t([[-1.0, -0.25]]))
    assert metrics["ppo_kl"].item() == pytest.approx((0.0 + 0.5) / 2)


def test_gspo_gradcheck():
    old = t([[-1.0, -0.7, -0.2]])
    mask = t([[1, 1, 0]])
    x = t([[-1.02, -0.69, -0.3]]).requires_grad_()
    assert torch.autograd.gradcheck(lambda lp: policy_loss_gspo(old, lp, t([0.7]), mask, 0.2, 0.2)[0], (x,))


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_every_loss_is_micro_batch_invariant_and_keyword_callable(name, mode):
    torch.manual_seed(1)
    B, T = 4, 5
    mask = (torch.rand(B, T) > 0.2).to(F64)
    old = -torch.rand(B, T, dtype=F64)
    logp = old + 0.05 * torch.randn(B, T, dtype=F64)
    adv = torch.randn(B, dtype=F64)
    kw = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": 3.0, "agg_mode": mode,
          "num_tokens": int(mask.sum()), "num_seqs": B, "scale_factor": None, "is_weights": None}
    fn = POLICY_LOSSES[name]
    if name in ("clip_cov", "kl_cov"):  # token selection is per call (as verl): compare whole vs whole only
        a, _ = fn(logprobs=logp, old_logprobs=old, advantages=adv, mask=mask, **kw)
        assert torch.isfinite(a)
        return
    whole, _ = fn(logprobs=logp, old_logprobs=old, advantages=adv, mask=mask, **kw)
    parts = sum(fn(logprobs=logp[s], old_logprobs=old[s], advantages=adv[s], mask=mask[s], **kw)[0]
                for s in (slice(0, 1), slice(1, 4)))
    assert torch.allclose(whole, parts)


def test_objective_is_weights_touch_only_the_policy_gradient():
    torch.manual_seed(2)
    B, T = 3, 4
    mask = torch.ones(B, T, dtype=F64)
    old = -torch.rand(B, T, dtype=F64)
    logp = (old + 0.1 * torch.randn(B, T, dtype=F64)).requires_grad_()
    ref = -torch.rand(B, T, dtype=F64)
    ent = torch.rand(B, T, dtype=F64)
    adv = torch.randn(B, dtype=F64)
    w = torch.rand(B, T, dtype=F64) * 2
    kw = {"num_tokens": B * T, "num_seqs": B, "ref_logprobs": ref, "kl_loss_coef": 0.5, "entropy": ent,
          "entropy_coeff": 0.01}
    loss, m = ppo_objective(logp, old, adv, mask, is_weights=w, **kw)
    pg, pg_m = policy_loss_vanilla(logp, old, adv, mask, num_tokens=B * T, is_weights=w)
    kl = agg_loss(kl_penalty(logp, ref, "low_var_kl"), mask, num_tokens=B * T)
    assert torch.allclose(loss, pg + 0.5 * kl - 0.01 * agg_loss(ent, mask, num_tokens=B * T))
    _, m_unweighted = ppo_objective(logp, old, adv, mask, **kw)
    for name in ("ppo_kl", "kl", "kl_loss", "entropy", "entropy_loss"):
        assert torch.allclose(m[name], m_unweighted[name]), name  # IS weights do not reach these
    assert torch.allclose(m["pg_loss"], pg) and torch.allclose(m["ppo_kl"], pg_m["ppo_kl"])
    assert set(m) == {"pg_loss", "pg_clipfrac", "ppo_kl", "pg_clipfrac_lower", "kl_loss", "kl", "entropy_loss",
                      "entropy"}


def test_objective_passes_each_loss_only_its_own_options():
    mask = torch.ones(1, 2, dtype=F64)
    options = {"clip_cov_ratio": 0.5, "clip_cov_lb": -10.0, "clip_cov_ub": 10.0, "kl_cov_ratio": 0.5,
               "ppo_kl_coef": 0.0}
    for mode in POLICY_LOSSES:
        loss, m = ppo_objective(t([[-1.0, -1.0]]), t([[-1.0, -1.0]]), t([1.0]), mask, loss_mode=mode,
                                loss_options=options)
        assert torch.isfinite(loss) and {"pg_clipfrac", "ppo_kl", "pg_clipfrac_lower"} <= set(m), mode
    with pytest.raises(ValueError, match="loss_mode 'ppo2' is unknown"):
        ppo_objective(t([[-1.0]]), t([[-1.0]]), t([1.0]), torch.ones(1, 1), loss_mode="ppo2")


@pytest.mark.parametrize("mode", AGG_MODES)
def test_objective_equals_the_old_worker_assembly(mode):
    torch.manual_seed(3)
    B, T = 3, 6
    mask = (torch.rand(B, T) > 0.3).to(F64)
    old, ref, ent = -torch.rand(B, T, dtype=F64), -torch.rand(B, T, dtype=F64), torch.rand(B, T, dtype=F64)
    logp = old + 0.2 * torch.randn(B, T, dtype=F64)
    adv = torch.randn(B, dtype=F64)
    agg = {"num_tokens": 20, "num_seqs": 5, "scale_factor": 6.0}
    loss, _ = ppo_objective(logp, old, adv, mask, agg_mode=mode, ref_logprobs=ref, kl_loss_coef=0.1,
                            kl_loss_type="k3+", entropy=ent, entropy_coeff=0.02, **agg)
    pg, _ = policy_loss_vanilla(logp, old, adv, mask, agg_mode=mode, **agg)
    expected = pg + 0.1 * agg_loss(kl_penalty(logp, ref, "k3+"), mask, mode, **agg) - 0.02 * agg_loss(ent, mask, mode,
                                                                                                      **agg)
    assert torch.allclose(loss, expected)
