"""RL math against hand-computed numbers (verl's `core_algos.py` formulas) and against plain-torch references."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.trainer.algos import (
    AGG_MODES,
    LossOutputs,
    PolicyLossInputs,
    VanillaOptions,
    agg_loss,
    broadcast_advantages,
    entropy_from_logits,
    grpo_advantages,
    kl_penalty,
    logprobs_from_logits,
    masked_mean,
    masked_sum,
    masked_whiten,
    policy_loss_vanilla,
)

F64 = torch.float64


def t(values) -> torch.Tensor:
    return torch.tensor(values, dtype=F64)


def vanilla(logp, old, adv, mask, options: VanillaOptions = VanillaOptions(), **agg) -> LossOutputs:
    """policy_loss_vanilla on one micro-batch; `agg` are PolicyLossInputs' aggregation fields."""
    return policy_loss_vanilla(PolicyLossInputs(logp, old, adv, mask, **agg), options)


def one_token_loss(new: float, old: float, adv: float, **options) -> torch.Tensor:
    loss, _ = vanilla(t([[new]]), t([[old]]), t([adv]), torch.ones(1, 1), VanillaOptions(**options))
    return loss


# ------------------------------------------------------------------------------------------------ policy loss


def test_reference_ratio_examples():
    ratio = math.exp(0.2)
    assert ratio == pytest.approx(1.2214, abs=1e-4)
    assert one_token_loss(-1.0, -1.2, +1.0).item() == pytest.approx(-1.2, abs=1e-12)  # clipped at 1 + 0.2
    assert one_token_loss(-1.0, -1.2, -1.0).item() == pytest.approx(ratio, abs=1e-12)  # not clipped: keeps 1.2214
    # Asymmetric clip: a wider upper bound lets the positive-advantage token keep its full ratio.
    assert one_token_loss(-1.0, -1.2, +1.0, clip_ratio_high=0.28).item() == pytest.approx(-ratio, abs=1e-12)


def test_dual_clip_bounds_loss_and_log_ratio_clamp():
    for log_ratio in (0.5, 1.0, 2.0, 5.0, 50.0):
        for adv in (-0.5, -2.0):
            loss = one_token_loss(log_ratio, 0.0, adv, clip_ratio_c=3.0).item()
            assert loss <= 3.0 * abs(adv) + 1e-12
    assert one_token_loss(50.0, 0.0, -2.0).item() == pytest.approx(6.0)
    # log ratio 50 is clamped to 20 before exp: positive advantage is clipped, no overflow anywhere.
    assert one_token_loss(50.0, 0.0, 1.0).item() == pytest.approx(-1.2)
    new = t([[50.0]]).requires_grad_()
    loss, metrics = vanilla(new, t([[0.0]]), t([-1.0]), torch.ones(1, 1))
    loss.backward()
    assert new.grad.item() == 0.0  # dual-capped and clamped: no gradient pushes further
    assert metrics["ppo_kl"].item() == pytest.approx(-20.0)


def test_clipfrac_metrics_on_crafted_tokens():
    ratios = [1.5, 1.0, 0.5, 4.0, 10.0]  # last token is masked out
    advs = [1.0, 1.0, -1.0, -1.0, 1.0]
    logp = t([[math.log(r) for r in ratios]])
    loss, metrics = vanilla(logp, torch.zeros_like(logp), t([advs]), t([[1, 1, 1, 1, 0]]))
    # token 1: A>0 ratio 1.5 -> clipped (-1.2); token 3: A<0 ratio 0.5 -> clipped (0.8);
    # token 4: A<0 ratio 4 -> c1 = 4 > 3 -> dual clip (3.0)
    assert loss.item() == pytest.approx((-1.2 - 1.0 + 0.8 + 3.0) / 4)
    assert metrics["pg_clipfrac"].item() == pytest.approx(2 / 4)
    assert metrics["pg_clipfrac_lower"].item() == pytest.approx(1 / 4)
    assert metrics["ppo_kl"].item() == pytest.approx(-(math.log(1.5) + math.log(0.5) + math.log(4.0)) / 4)
    assert all(value.dim() == 0 and not value.requires_grad for value in metrics.values())


def test_advantages_per_sequence_equal_broadcast_per_token():
    torch.manual_seed(0)
    logp, old = torch.randn(3, 4, dtype=F64), torch.randn(3, 4, dtype=F64)
    mask = (torch.rand(3, 4) > 0.3).to(F64)
    adv_B = t([0.7, -1.3, 0.0])
    loss_seq, _ = vanilla(logp, old, adv_B, mask)
    loss_tok, _ = vanilla(logp, old, broadcast_advantages(adv_B, mask), mask)
    assert loss_seq.item() == pytest.approx(loss_tok.item(), abs=1e-12)
    assert torch.equal(broadcast_advantages(adv_B, mask)[1], -1.3 * mask[1])


def test_gradients_exactly_zero_on_masked_tokens():
    torch.manual_seed(1)
    logp = torch.randn(4, 6, dtype=F64)
    logp[:, 4:] = 1e4  # garbage in padding must not leak
    logp.requires_grad_()
    old, ref = torch.randn(4, 6, dtype=F64), torch.randn(4, 6, dtype=F64)
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[:, 4:] = False
    mask[2, 1] = False
    for mode in AGG_MODES:
        for kind in ("k1", "k3", "k3+", "abs"):
            logp.grad = None
            pg, _ = vanilla(logp, old, t([1.0, -1.0, 0.5, -2.0]), mask, agg_mode=mode, scale_factor=6)
            kl = agg_loss(kl_penalty(logp, ref, kind), mask, mode, scale_factor=6)
            (pg + 0.1 * kl).backward()
            assert torch.all(logp.grad[~mask] == 0)
            assert torch.all(logp.grad[mask] != 0)


# ---------------------------------------------------------------------------------------------- aggregation


def test_length_weighting_reference_example():
    mask = torch.zeros(2, 6)
    mask[0, :2] = 1  # trajectory A: 2 tokens
    mask[1, :] = 1  # trajectory B: 6 tokens

    def row_weights(mode: str) -> list[float]:
        loss = torch.ones(2, 6, dtype=F64, requires_grad=True)
        agg_loss(loss, mask, mode, scale_factor=6).backward()
        return loss.grad.sum(-1).tolist()

    assert row_weights("token-mean") == pytest.approx([2 / 8, 6 / 8])
    assert row_weights("seq-mean-token-mean") == pytest.approx([1 / 2, 1 / 2])
    assert row_weights("seq-mean-token-sum") == pytest.approx([2 / 2, 6 / 2])
    assert row_weights("token-sum") == pytest.approx([2.0, 6.0])
    assert row_weights("seq-mean-token-sum-norm") == pytest.approx([2 / 6 / 2, 6 / 6 / 2])


def test_agg_loss_rejects_bad_input():
    loss, mask = torch.ones(2, 3), torch.ones(2, 3)
    with pytest.raises(ValueError, match="needs a positive scale_factor"):
        agg_loss(loss, mask, "seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="valid modes: token-mean"):
        agg_loss(loss, mask, "token_mean")
    with pytest.raises(ValueError, match="same"):
        agg_loss(loss, mask[:, :2])
    assert agg_loss(loss, torch.zeros(2, 3)).item() == 0.0  # empty batch: 0, not nan


@pytest.mark.parametrize("mode", AGG_MODES)
def test_micro_batch_invariance(mode: str):
    torch.manual_seed(2)
    B, T = 8, 7
    logp_leaf = torch.randn(B, T, dtype=F64, requires_grad=True)
    old, ref = torch.randn(B, T, dtype=F64), torch.randn(B, T, dtype=F64)
    adv = torch.randn(B, dtype=F64)
    lengths = torch.tensor([7, 1, 4, 0, 6, 3, 2, 5])  # includes an all-masked padding row
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(F64)
    num_tokens, num_seqs = mask.sum(), B

    def accumulated_grad(num_micro: int) -> torch.Tensor:
        logp_leaf.grad = None
        for rows in torch.arange(B).chunk(num_micro):
            width = int(lengths[rows].max().clamp_min(1))  # micro-batches padded to their own horizon
            cut = (rows, slice(0, width))
            kwargs = dict(num_tokens=num_tokens, num_seqs=num_seqs, scale_factor=T)
            pg, _ = vanilla(logp_leaf[cut], old[cut], adv[rows], mask[cut], agg_mode=mode, **kwargs)
            kl = agg_loss(kl_penalty(logp_leaf[cut], ref[cut], "low_var_kl"), mask[cut], mode, **kwargs)
            (pg + 0.1 * kl).backward()
        return logp_leaf.grad.clone()

    full = accumulated_grad(1)
    assert full.abs().sum() > 0
    for num_micro in (2, 4):
        torch.testing.assert_close(accumulated_grad(num_micro), full, atol=1e-6, rtol=0)


def test_local_counts_break_invariance_for_token_mean():
    # Why num_tokens must be global: two micro-batches each averaging locally weight tokens differently.
    loss = torch.ones(2, 4, dtype=F64, requires_grad=True)
    mask = t([[1, 0, 0, 0], [1, 1, 1, 1]])
    (agg_loss(loss[:1], mask[:1]) + agg_loss(loss[1:], mask[1:])).backward()
    assert loss.grad[0, 0].item() == pytest.approx(1.0) and loss.grad[1, 0].item() == pytest.approx(0.25)


# ---------------------------------------------------------------------------------------------------- GRPO


def test_grpo_hand_computed_with_bessel_std_and_degenerate_groups():
    #            a    b    a    c    a    c    a    d    e    e    e
    scores = t([1.0, 0.3, 0.0, 1.0, 0.0, 3.0, 1.0, 5.0, 2.0, 2.0, 2.0])
    ids = ["a", "b", "a", "c", "a", "c", "a", "d", "e", "e", "e"]
    adv = grpo_advantages(scores, ids)
    std_a = math.sqrt(4 * 0.25 / 3)  # unbiased: mean 0.5, four deviations of 0.5, n-1 = 3
    std_c = math.sqrt(2.0)  # [1, 3]: mean 2, (1 + 1) / 1 (biased std would give 1)
    expected = [0.5 / (std_a + 1e-6), 0.0, -0.5 / (std_a + 1e-6), -1 / (std_c + 1e-6), -0.5 / (std_a + 1e-6),
                1 / (std_c + 1e-6), 0.5 / (std_a + 1e-6), 0.0, 0.0, 0.0, 0.0]  # fmt: skip
    torch.testing.assert_close(adv, t(expected), atol=1e-12, rtol=0)
    assert adv[2].item() == pytest.approx(-0.8660, abs=1e-4)
    # Same groups given as ints or as a tensor.
    int_ids = [ord(g) for g in ids]
    torch.testing.assert_close(grpo_advantages(scores, int_ids), adv)
    torch.testing.assert_close(grpo_advantages(scores, torch.tensor(int_ids)), adv)


def test_dr_grpo_and_input_errors():
    adv = grpo_advantages(t([1.0, 3.0, 7.0, 4.0]), [0, 0, 1, 2], norm_by_std=False)
    assert adv.tolist() == [-1.0, 1.0, 0.0, 0.0]  # group 1 and 2 are singletons
    assert grpo_advantages(torch.tensor([1, 0]), ["x", "x"]).dtype == torch.float32
    with pytest.raises(ValueError, match="one id per trajectory"):
        grpo_advantages(t([1.0, 2.0]), ["x"])
    with pytest.raises(ValueError, match=r"non-finite rewards at trajectories \[1\]"):
        grpo_advantages(t([1.0, float("nan")]), ["x", "x"])


# ------------------------------------------------------------------------------------------------------ KL


def test_kl_estimators_hand_values():
    logp, ref = t([[-1.0, -2.0, -0.5]]), t([[-1.5, -1.0, -0.5]])  # d = [0.5, -1, 0]
    k3 = [math.exp(-0.5) - 0.5, math.e - 2.0, 0.0]
    expected = {"kl": [0.5, -1.0, 0.0], "abs": [0.5, 1.0, 0.0], "mse": [0.125, 0.5, 0.0], "low_var_kl": k3}
    aliases = {"kl": "k1", "mse": "k2", "low_var_kl": "k3"}
    for kind, values in expected.items():
        torch.testing.assert_close(kl_penalty(logp, ref, kind), t([values]), atol=1e-12, rtol=0)
        if kind in aliases:
            torch.testing.assert_close(kl_penalty(logp, ref, aliases[kind]), t([values]), atol=0, rtol=0)
    assert kl_penalty(logp, ref).tolist() == kl_penalty(logp, ref, "k3").tolist()  # default is low_var_kl
    with pytest.raises(ValueError, match="valid kinds: kl, k1, abs, mse, k2, low_var_kl, k3"):
        kl_penalty(logp, ref, "full")


def test_low_var_kl_clamps():
    d = t([[30.0, 11.0, -5.0, -30.0]])
    kl = kl_penalty(d, torch.zeros_like(d), "k3")
    # d=30 -> clamp 20 -> e^-20 + 19 -> capped at 10; d=11 -> e^-11 + 10 = 10.0000167 -> 10; d<=-5 -> e^5 - 6 -> 10
    assert kl.tolist() == [[10.0, 10.0, 10.0, 10.0]]
    small = t([[-2.0]])
    assert kl_penalty(small, torch.zeros_like(small), "k3").item() == pytest.approx(math.exp(2) - 3)


@pytest.mark.parametrize("kind", ["k1+", "kl+", "abs+", "k3+", "low_var_kl+", "k2+"])
def test_straight_through_value_of_estimator_gradient_of_k2(kind: str):
    torch.manual_seed(3)
    logp = torch.randn(2, 5, dtype=F64, requires_grad=True)
    ref = torch.randn(2, 5, dtype=F64)
    value = kl_penalty(logp, ref, kind)
    torch.testing.assert_close(value, kl_penalty(logp, ref, kind[:-1]), atol=0, rtol=0)
    weights = torch.rand(2, 5, dtype=F64)
    (value * weights).sum().backward()
    k2_grad = (logp - ref).detach() * weights  # d/dlogp of d^2/2
    torch.testing.assert_close(logp.grad, k2_grad, atol=1e-12, rtol=0)


# ------------------------------------------------------------------------------------ logprobs / entropy


def reference_logprobs(logits, labels, temperature):
    return torch.log_softmax(logits / temperature, dim=-1).gather(-1, labels[..., None]).squeeze(-1)


def reference_entropy(logits, temperature):
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return -(logp.exp() * logp).sum(-1)


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.6])
@pytest.mark.parametrize("chunk", [11, 25, 120, 1 << 25])  # 1 position, 2 positions, 2 sequences, all
def test_chunked_logprobs_and_entropy_match_reference(temperature: float, chunk: int):
    torch.manual_seed(4)
    base = torch.randn(3, 6, 11, dtype=F64) * 3
    logits = base[:, 1:, :]  # a non-contiguous slice, as the trainer takes it from model output
    labels = torch.randint(0, 11, (3, 5))
    weights = torch.randn(3, 5, dtype=F64)
    for ours_fn, ref_fn in (
        (lambda x: logprobs_from_logits(x, labels, temperature, max_chunk_elements=chunk),
         lambda x: reference_logprobs(x, labels, temperature)),
        (lambda x: entropy_from_logits(x, temperature, max_chunk_elements=chunk),
         lambda x: reference_entropy(x, temperature)),
    ):  # fmt: skip
        ours_in, ref_in = logits.clone().requires_grad_(), logits.clone().requires_grad_()
        ours, ref = ours_fn(ours_in), ref_fn(ref_in)
        torch.testing.assert_close(ours, ref, atol=1e-6, rtol=0)
        (ours * weights).sum().backward()
        (ref * weights).sum().backward()
        torch.testing.assert_close(ours_in.grad, ref_in.grad, atol=1e-6, rtol=0)


def test_logprobs_shapes_dtypes_and_temperature_errors():
    torch.manual_seed(5)
    logits = torch.randn(7, 13, dtype=torch.bfloat16)
    labels = torch.randint(0, 13, (7,))
    out = logprobs_from_logits(logits, labels, max_chunk_elements=26)
    assert out.shape == (7,) and out.dtype == torch.float32
    torch.testing.assert_close(out, reference_logprobs(logits.float(), labels, 1.0), atol=1e-6, rtol=0)
    uniform = entropy_from_logits(torch.zeros(2, 1, 8))
    assert uniform.shape == (2, 1) and uniform.flatten().tolist() == pytest.approx([math.log(8)] * 2)
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match="use 1.0 for greedy"):
            logprobs_from_logits(logits, labels, bad)
        with pytest.raises(ValueError, match="temperature must be > 0"):
            entropy_from_logits(logits, bad)
    with pytest.raises(ValueError, match="labels shape"):
        logprobs_from_logits(logits, labels[:3])


# ------------------------------------------------------------------------------------------------- masked ops


def test_masked_reductions_and_whiten():
    x = t([[1.0, 2.0, float("inf")], [3.0, 6.0, float("nan")]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    assert masked_sum(x, mask).item() == 12.0
    assert masked_mean(x, mask).item() == 3.0
    assert masked_mean(x, mask, dim=-1).tolist() == [1.5, 4.5]
    white = masked_whiten(x, mask)
    sel = t([1.0, 2.0, 3.0, 6.0])
    expected = (sel - 3.0) / torch.sqrt(sel.var(unbiased=True) + 1e-8)
    torch.testing.assert_close(white[mask.bool()], expected, atol=1e-12, rtol=0)
    assert white[:, 2].tolist() == [0.0, 0.0]
    torch.testing.assert_close(masked_whiten(x, mask, shift_mean=False)[mask.bool()], expected + 3.0)
    with pytest.raises(ValueError, match="at least 2"):
        masked_whiten(x, torch.tensor([[1, 0, 0], [0, 0, 0]]))
