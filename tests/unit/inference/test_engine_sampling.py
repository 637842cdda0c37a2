"""Sampling math of the local engine: the logprob definition the trainer relies on, top-k/top-p, seeds."""

from __future__ import annotations

import math

import torch

from agentrl.inference.sampling import filter_top_k_top_p, make_generator, sample_batch
from agentrl.trainer.algos import logprobs_from_logits
from agentrl.types import SamplingParams


def _logits(seed: int = 0, v: int = 50) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(4, v, generator=g) * 3


def test_greedy_picks_argmax_with_logprobs_under_temperature_one():
    logits = _logits()
    params = [SamplingParams(max_new_tokens=1, temperature=0.0)] * 4
    tokens, logprobs = sample_batch(logits, params, [None] * 4)
    assert tokens == logits.argmax(-1).tolist()
    expected = logprobs_from_logits(logits, torch.tensor(tokens), temperature=1.0)
    assert torch.allclose(torch.tensor(logprobs), expected, atol=1e-6)


def test_sampled_logprobs_match_trainer_definition_before_filtering():
    logits = _logits(1)
    params = [SamplingParams(max_new_tokens=1, temperature=0.7, top_k=5, top_p=0.9, seed=i) for i in range(4)]
    tokens, logprobs = sample_batch(logits, params, [make_generator(i) for i in range(4)])
    expected = logprobs_from_logits(logits, torch.tensor(tokens), temperature=0.7)
    assert torch.allclose(torch.tensor(logprobs), expected, atol=1e-6)
    top5 = torch.topk(logits, 5, dim=-1).indices
    assert all(t in top5[i].tolist() for i, t in enumerate(tokens))


def test_top_k_one_equals_greedy():
    logits = _logits(2)
    params = [SamplingParams(max_new_tokens=1, temperature=1.3, top_k=1, seed=i) for i in range(4)]
    tokens, _ = sample_batch(logits, params, [make_generator(i) for i in range(4)])
    assert tokens == logits.argmax(-1).tolist()


def test_top_p_keeps_smallest_nucleus():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    kept = filter_top_k_top_p(logits, top_k=-1, top_p=0.75)
    assert torch.isfinite(kept).tolist() == [True, True, False, False]
    # top_p smaller than the top token's mass still keeps the top token
    kept = filter_top_k_top_p(logits, top_k=-1, top_p=0.1)
    assert torch.isfinite(kept).tolist() == [True, False, False, False]


def test_seeded_sampling_is_reproducible_and_seed_dependent():
    logits = torch.zeros(1, 1000)
    p = [SamplingParams(max_new_tokens=1, temperature=1.0, seed=7)]
    a = [sample_batch(logits, p, [g])[0][0] for g in [make_generator(7)] for _ in range(20)]
    g = make_generator(7)
    b = [sample_batch(logits, p, [g])[0][0] for _ in range(20)]
    g2 = make_generator(8)
    c = [sample_batch(logits, p, [g2])[0][0] for _ in range(20)]
    assert a == b
    assert b != c
    # uniform over 1000 tokens: every logprob is -log(1000)
    _, lp = sample_batch(logits, p, [make_generator(1)])
    assert math.isclose(lp[0], -math.log(1000), rel_tol=1e-5)


def test_banned_tokens_leave_the_distribution_greedy_and_sampled():
    logits = _logits(3)
    top = logits.argmax(-1).tolist()
    banned = [frozenset({top[0]}), None, frozenset({top[2], 10_000}), frozenset()]  # ids past the vocab: ignored
    params = [SamplingParams(max_new_tokens=2, temperature=0.0)] * 3 + [SamplingParams(max_new_tokens=2, seed=0)]
    tokens, logprobs = sample_batch(logits, params, [None, None, None, make_generator(0)], banned)
    masked = logits.clone()
    masked[0, top[0]] = masked[2, top[2]] = float("-inf")
    assert tokens[:3] == masked[:3].argmax(-1).tolist() and tokens[0] != top[0] and tokens[1] == top[1]
    expected = logprobs_from_logits(masked[:3], torch.tensor(tokens[:3]), temperature=1.0)
    assert torch.allclose(torch.tensor(logprobs[:3]), expected, atol=1e-6)  # the masked distribution's logprobs
    assert math.isfinite(logprobs[3])
    assert sample_batch(logits, params, [None] * 3 + [make_generator(0)], [None] * 4) == \
        sample_batch(logits, params, [None] * 3 + [make_generator(0)])  # nothing banned: unchanged
    sampled = [sample_batch(logits[:1], [SamplingParams(max_new_tokens=2, seed=s)], [make_generator(s)],
                            [frozenset(range(0, 50, 2))])[0][0] for s in range(50)]
    assert all(t % 2 == 1 for t in sampled)  # a banned id is never drawn


def test_inverse_cdf_draws_follow_the_distribution_and_never_a_zero_mass_token():
    from agentrl.inference.sampling import draw_inverse_cdf

    probs = torch.tensor([[0.5, 0.0, 0.3, 0.2, 0.0]])
    g = make_generator(0)
    counts = torch.zeros(5)
    for _ in range(4000):
        counts[draw_inverse_cdf(probs, [g])] += 1
    freq = counts / counts.sum()
    assert counts[1] == 0 and counts[4] == 0  # zero mass, first and last position after mass
    assert torch.allclose(freq, probs[0], atol=0.03)
    # unnormalised rows are drawn in proportion; a uniform just below 1 still lands on a token with mass
    assert draw_inverse_cdf(torch.tensor([[0.0, 2.0, 0.0]]), [make_generator(3)]).tolist() == [1]


def test_inverse_cdf_with_a_uniform_at_the_ends(monkeypatch):
    from agentrl.inference import sampling

    probs = torch.tensor([[0.0, 0.25, 0.75, 0.0]])
    for u in (0.0, 1.0 - 2 ** -53):  # torch.rand's smallest and largest float64 draws
        monkeypatch.setattr(sampling.torch, "rand", lambda *a, _u=u, **k: torch.tensor(_u, dtype=torch.float64))
        assert sampling.draw_inverse_cdf(probs, [None]).tolist() == ([1] if u == 0.0 else [2])
