"""The policy-loss family and the total objective against hand-computed numbers and analytic gradients."""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import pytest
import torch

from agentrl.trainer.algos import (
    AGG_MODES,
    POLICY_LOSSES,
    CispoOptions,
    ClipCovOptions,
    GspoOptions,
    KlCovOptions,
    LossOutputs,
    PolicyLossInputs,
    PolicyLossKnobs,
    ReinforceOptions,
    VanillaOptions,
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


def x(logp, old, adv, mask, **agg) -> PolicyLossInputs:
    return PolicyLossInputs(logprobs_B_T=logp, old_logprobs_B_T=old, advantages_B_T=adv, mask_B_T=mask, **agg)


def test_seed_ratio_1_2214_through_every_ratio_loss():
    old, new, one = t([[-1.2]]), t([[-1.0]]), torch.ones(1, 1)
    assert math.exp(0.2) == pytest.approx(1.2214, abs=1e-4)
    # vanilla / clip_cov with eps 0.2: A=+1 -> -min(1.2214, 1.2) = -1.2; A=-1 -> max(1.2214, 1.2) = 1.2214
    for fn, options in ((policy_loss_clip_cov, ClipCovOptions(0.2, 0.2)),):
        assert fn(x(new, old, t([1.0]), one), options)[0].item() == pytest.approx(-1.2)
        assert fn(x(new, old, t([-1.0]), one), options)[0].item() == pytest.approx(1.2214, abs=1e-4)
    # gspo of a one-token sequence: s = exp(0.2), the same clipped surrogate
    gspo = policy_loss_gspo(x(new, old, t([1.0]), one, agg_mode="seq-mean-token-mean"), GspoOptions(0.2, 0.2))
    assert gspo.loss.item() == pytest.approx(-1.2)
    # cispo: -sg(clip(1.2214, 0.8, 1.2)) * A * logp = -1.2 * 1 * -1.0 = 1.2
    loss, metrics = policy_loss_cispo(x(new, old, t([1.0]), one), CispoOptions(0.2, 0.2))
    assert loss.item() == pytest.approx(1.2) and metrics["pg_clipfrac"].item() == 1.0
    # kl_cov: no clip; the only token is the top-covariance one: -A*ratio + 0.1 * |0.2|
    kl_cov = policy_loss_kl_cov(x(new, old, t([1.0]), one), KlCovOptions())
    assert kl_cov.loss.item() == pytest.approx(-math.exp(0.2) + 0.02)


def test_gspo_uses_the_length_normalised_sequence_ratio_and_its_gradient():
    old = t([[-1.0, -2.0, -0.5, 0.0]])
    logp = t([[-0.9, -2.1, -0.3, 5.0]]).requires_grad_()
    mask = t([[1, 1, 1, 0]])
    loss, metrics = policy_loss_gspo(x(logp, old, t([2.0]), mask, agg_mode="seq-mean-token-mean"),
                                     GspoOptions(0.2, 0.2))
    s = math.exp((0.1 - 0.1 + 0.2) / 3)
    assert loss.item() == pytest.approx(-2.0 * s)  # seq-mean-token-mean of -A * s over 3 tokens
    loss.backward()
    # d/dlogp_t of mean_t(-A * r_t) with r_t = s * exp(logp_t - sg(logp_t)): -A * s / |y|
    assert torch.allclose(logp.grad, t([[-2.0 * s / 3] * 3 + [0.0]]))
    assert metrics["pg_clipfrac_lower"].item() == 0.0
    # outside the clip range the clipped branch has no gradient
    logp2 = t([[0.0, 0.0, 0.0, 0.0]]).requires_grad_()
    old2 = t([[-0.3, -0.3, -0.3, 0.0]])
    loss2, m2 = policy_loss_gspo(x(logp2, old2, t([1.0]), mask, agg_mode="seq-mean-token-mean"), GspoOptions())
    loss2.backward()
    assert loss2.item() == pytest.approx(-(1 + 4e-4)) and (logp2.grad == 0).all() and m2["pg_clipfrac"].item() == 1


def test_gspo_agg_modes_match_vanilla_for_single_token_sequences():
    old, logp, adv, mask = t([[-1.0], [-0.5]]), t([[-1.05], [-0.45]]), t([1.0, -1.0]), torch.ones(2, 1, dtype=F64)
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        g, _ = policy_loss_gspo(x(logp, old, adv, mask, agg_mode=mode), GspoOptions(0.2, 0.2))
        v, _ = policy_loss_vanilla(x(logp, old, adv, mask, agg_mode=mode), VanillaOptions())
        assert torch.allclose(g, v)


def test_cispo_keeps_a_gradient_on_clipped_tokens():
    logp = t([[-0.5, -1.0]]).requires_grad_()
    loss, _ = policy_loss_cispo(x(logp, t([[-1.5, -1.0]]), t([1.0]), torch.ones(1, 2, dtype=F64)),
                                CispoOptions(0.2, 0.2))
    loss.backward()
    # weights sg(clip(e^1, 0.8, 1.2)) = 1.2 and 1.0; token-mean over 2 tokens: d/dlogp = -w * A / 2
    assert torch.allclose(logp.grad, t([[-0.6, -0.5]]))


def test_clip_cov_drops_the_gradient_of_selected_high_covariance_tokens():
    adv = t([[3.0, 3.0, -3.0, -3.0]])
    logp = t([[0.0, -4.0, -4.0, 0.0]]).requires_grad_()
    old = logp.detach().clone()
    mask = torch.ones(1, 4, dtype=F64)
    # means: A 0, logp -2; cov = A * (logp + 2): tokens 0 and 2 have 6 (in (1, 10)), tokens 1 and 3 have -6
    options = ClipCovOptions(0.2, 0.2, clip_cov_ratio=0.5, clip_cov_lb=1.0, clip_cov_ub=10.0,
                             generator=torch.Generator().manual_seed(0))
    loss, metrics = policy_loss_clip_cov(x(logp, old, adv, mask), options)
    loss.backward()
    dropped = logp.grad == 0
    assert int(dropped.sum()) == 2 and bool(dropped[0, 0]) and bool(dropped[0, 2])
    assert metrics["pg_clipfrac"].item() == 0.5
    assert loss.item() == pytest.approx((0 + -3.0 + 0 + 3.0) / 4)


def test_kl_cov_penalises_the_largest_covariance_tokens():
    adv = t([[3.0, 3.0, -3.0, -3.0]])
    old = t([[0.0, -4.0, -4.0, 0.0]])
    logp = (old + t([[0.1, 0.1, -0.1, 0.1]])).requires_grad_()
    loss, metrics = policy_loss_kl_cov(x(logp, old, adv, torch.ones(1, 4, dtype=F64)), KlCovOptions(0.25, 1.0))
    ratios = torch.exp(t([0.1, 0.1, -0.1, 0.1]))
    # covariance with logp: token 0 is the largest (3 * (0.1 + 1.975)); it gets + |0.1|
    expected = (-(adv[0] * ratios).sum() + 0.1) / 4
    assert loss.item() == pytest.approx(expected.item())
    assert metrics["pg_clipfrac"].item() == 0.25


def test_reinforce_is_minus_weighted_advantage_times_logp():
    logp = t([[-1.0, -2.0]]).requires_grad_()
    w = t([[2.0, 0.5]])
    inputs = PolicyLossInputs(logp, t([[-1.0, -1.5]]), t([1.0]), torch.ones(1, 2, dtype=F64), is_weights_B_T=w)
    loss, metrics = policy_loss_reinforce(inputs, ReinforceOptions())
    assert loss.item() == pytest.approx((2.0 * 1.0 + 0.5 * 2.0) / 2)
    loss.backward()
    assert torch.allclose(logp.grad, t([[-1.0, -0.25]]))
    assert metrics["ppo_kl"].item() == pytest.approx((0.0 + 0.5) / 2)


def test_gspo_gradcheck():
    old = t([[-1.0, -0.7, -0.2]])
    mask = t([[1, 1, 0]])
    leaf = t([[-1.02, -0.69, -0.3]]).requires_grad_()

    def gspo_loss(lp: torch.Tensor) -> torch.Tensor:
        return policy_loss_gspo(x(lp, old, t([0.7]), mask, agg_mode="seq-mean-token-mean"), GspoOptions(0.2, 0.2)).loss

    assert torch.autograd.gradcheck(gspo_loss, (leaf,))


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_every_loss_is_micro_batch_invariant_through_the_registry(name, mode):
    torch.manual_seed(1)
    B, T = 4, 5
    mask = (torch.rand(B, T) > 0.2).to(F64)
    old = -torch.rand(B, T, dtype=F64)
    logp = old + 0.05 * torch.randn(B, T, dtype=F64)
    adv = torch.randn(B, dtype=F64)
    agg = {"agg_mode": mode, "num_tokens": int(mask.sum()), "num_seqs": B}
    entry = POLICY_LOSSES[name]
    options = entry.options(PolicyLossKnobs(clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0))
    if name in ("clip_cov", "kl_cov"):  # token selection is per call (as verl): compare whole vs whole only
        a, _ = entry.fn(x(logp, old, adv, mask, **agg), options)
        assert torch.isfinite(a)
        return
    whole, _ = entry.fn(x(logp, old, adv, mask, **agg), options)
    parts = sum(entry.fn(x(logp[s], old[s], adv[s], mask[s], **agg), options).loss
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
    kw = {"ref_logprobs_B_T": ref, "kl_loss_coef": 0.5, "entropy_B_T": ent, "entropy_coeff": 0.01}
    counts = {"num_tokens": B * T, "num_seqs": B}
    loss, m = ppo_objective(x(logp, old, adv, mask, is_weights_B_T=w, **counts), **kw)
    pg, pg_m = policy_loss_vanilla(x(logp, old, adv, mask, is_weights_B_T=w, num_tokens=B * T), VanillaOptions())
    kl = agg_loss(kl_penalty(logp, ref, "low_var_kl"), mask, num_tokens=B * T)
    assert torch.allclose(loss, pg + 0.5 * kl - 0.01 * agg_loss(ent, mask, num_tokens=B * T))
    _, m_unweighted = ppo_objective(x(logp, old, adv, mask, **counts), **kw)
    for name in ("ppo_kl", "kl", "kl_loss", "entropy", "entropy_loss"):
        assert torch.allclose(m[name], m_unweighted[name]), name  # IS weights do not reach these
    assert torch.allclose(m["pg_loss"], pg) and torch.allclose(m["ppo_kl"], pg_m["ppo_kl"])
    assert set(m) == {"pg_loss", "pg_clipfrac", "ppo_kl", "pg_clipfrac_lower", "kl_loss", "kl", "entropy_loss",
                      "entropy"}


def test_objective_runs_every_loss_mode_with_the_same_records():
    mask = torch.ones(1, 2, dtype=F64)
    knobs = PolicyLossKnobs(clip_cov_ratio=0.5, clip_cov_lb=-10.0, clip_cov_ub=10.0, kl_cov_ratio=0.5, ppo_kl_coef=0.0)
    for mode in POLICY_LOSSES:
        out = ppo_objective(x(t([[-1.0, -1.0]]), t([[-1.0, -1.0]]), t([1.0]), mask), mode, knobs)
        assert isinstance(out, LossOutputs), mode
        assert torch.isfinite(out.loss) and {"pg_clipfrac", "ppo_kl", "pg_clipfrac_lower"} <= set(out.metrics), mode
    with pytest.raises(ValueError, match="loss_mode 'ppo2' is unknown"):
        ppo_objective(x(t([[-1.0]]), t([[-1.0]]), t([1.0]), torch.ones(1, 1)), "ppo2")


@pytest.mark.parametrize("mode", AGG_MODES)
def test_objective_equals_the_old_worker_assembly(mode):
    torch.manual_seed(3)
    B, T = 3, 6
    mask = (torch.rand(B, T) > 0.3).to(F64)
    old, ref, ent = -torch.rand(B, T, dtype=F64), -torch.rand(B, T, dtype=F64), torch.rand(B, T, dtype=F64)
    logp = old + 0.2 * torch.randn(B, T, dtype=F64)
    adv = torch.randn(B, dtype=F64)
    agg = {"num_tokens": 20, "num_seqs": 5, "scale_factor": 6.0}
    inputs = x(logp, old, adv, mask, agg_mode=mode, **agg)
    loss, _ = ppo_objective(inputs, ref_logprobs_B_T=ref, kl_loss_coef=0.1, kl_loss_type="k3+", entropy_B_T=ent,
                            entropy_coeff=0.02)
    pg, _ = policy_loss_vanilla(inputs, VanillaOptions())
    expected = pg + 0.1 * agg_loss(kl_penalty(logp, ref, "k3+"), mask, mode, **agg) - 0.02 * agg_loss(ent, mask, mode,
                                                                                                      **agg)
    assert torch.allclose(loss, expected)


def test_options_records_take_each_field_from_the_same_named_knob():
    knobs = PolicyLossKnobs(clip_ratio_low=0.1, clip_ratio_high=0.3, clip_ratio_c=4.0, clip_cov_ratio=0.01,
                            clip_cov_lb=0.5, clip_cov_ub=7.0, kl_cov_ratio=0.02, ppo_kl_coef=0.25)
    for name, entry in POLICY_LOSSES.items():
        options = entry.options(knobs)
        for field in dataclasses.fields(options):
            if field.name != "generator":
                assert getattr(options, field.name) == getattr(knobs, field.name), (name, field.name)


def test_inputs_reject_misshaped_advantages():
    logp = torch.zeros(2, 4, dtype=F64)
    with pytest.raises(ValueError, match=r"advantages must be \[B\] or \[B, T\], got \(3,\)"):
        x(logp, logp, torch.zeros(3, dtype=F64), torch.ones(2, 4))
    assert x(logp, logp, torch.zeros(2, dtype=F64), torch.ones(2, 4)).advantages_B_T.shape == (2, 1)


DOCS = Path(__file__).resolve().parents[3] / "docs" / "algorithms.md"


def test_the_documented_user_loss_gets_the_same_records(tmp_path, monkeypatch):
    section = DOCS.read_text().split("### Your own loss", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    (tmp_path / "my_losses.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    from agentrl.config import load_config
    from agentrl.trainer.config import TrainConfig

    cfg = load_config(TrainConfig, overrides=["actor.policy_loss.loss_mode=my_losses:clipped_weight_reinforce"])
    torch.manual_seed(4)
    B, T = 3, 5
    mask = (torch.rand(B, T) > 0.3).to(F64)
    old = -torch.rand(B, T, dtype=F64)
    logp = (old + 0.3 * torch.randn(B, T, dtype=F64)).requires_grad_()
    inputs = x(logp, old, torch.randn(B, dtype=F64), mask, is_weights_B_T=torch.rand(B, T, dtype=F64), num_seqs=B)
    out = ppo_objective(inputs, cfg.actor.policy_loss.loss_mode, cfg.actor.policy_loss_knobs())
    assert isinstance(out, LossOutputs) and set(out.metrics) == {"pg_loss", "ppo_kl"}
    cispo = policy_loss_cispo(inputs, CispoOptions(cfg.actor.clip_ratio_low, cfg.actor.clip_ratio_high))
    assert torch.allclose(out.loss, cispo.loss) and torch.allclose(out.metrics["ppo_kl"], cispo.metrics["ppo_kl"])
