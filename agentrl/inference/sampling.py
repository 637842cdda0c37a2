"""Per-row sampling for a decode batch: pure functions over logits.

Definitions shared with the trainer (`agentrl.trainer.algos.logprobs_from_logits`):
the logprob of a sampled token is `log_softmax(logits / T)[token]`, taken *before* top-k/top-p filtering.
Temperature 0 means greedy (argmax of the raw logits) and its logprobs are reported under T = 1.
"""

from __future__ import annotations

import torch

from agentrl.types import SamplingParams


def effective_temperature(temperature: float) -> float:
    """The temperature logprobs are computed under: T itself, or 1.0 for greedy (T = 0)."""
    return temperature if temperature > 0 else 1.0


def scaled_logprobs(logits_B_V: torch.Tensor, temperatures_B: torch.Tensor) -> torch.Tensor:
    """log_softmax(logits / T) per row in fp32. `temperatures_B` must already be effective (> 0)."""
    return torch.log_softmax(logits_B_V.float() / temperatures_B.unsqueeze(-1), dim=-1)


def filter_top_k_top_p(logits_V: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set every token outside the top-k / nucleus (top-p) set to -inf. Always keeps the most likely token."""
    if top_k > 0 and top_k < logits_V.numel():
        kth = torch.topk(logits_V, top_k).values[-1]
        logits_V = logits_V.masked_fill(logits_V < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits_V, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # drop a token when the mass of the tokens strictly before it already reaches top_p
        drop_sorted = (torch.cumsum(probs, dim=-1) - probs) >= top_p
        drop_sorted[0] = False
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        logits_V = logits_V.masked_fill(drop, float("-inf"))
    return logits_V


def make_generator(seed: int | None) -> torch.Generator:
    """A private RNG per request: seeded requests reproduce regardless of what else is in the batch."""
    g = torch.Generator(device="cpu")
    if seed is None:
        g.seed()
    else:
        g.manual_seed(seed)
    return g


def mask_tokens(logits_B_V: torch.Tensor, banned: list[frozenset[int] | None]) -> torch.Tensor:
    """A copy of the logits with row i's `banned[i]` ids set to -inf (ids outside the vocabulary are ignored);
    the logits themselves when nothing is banned."""
    if not any(banned):
        return logits_B_V
    vocab = logits_B_V.shape[-1]
    out = logits_B_V.clone()
    for i, ids in enumerate(banned):
        cols = [t for t in ids or () if 0 <= t < vocab]
        if cols:
            out[i, cols] = float("-inf")
    return out


def draw_inverse_cdf(probs_R_V: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
    """One token per row of `probs_R_V` (non-negative, any row sum > 0), each drawn with one uniform from its row's
    own generator (None: the global RNG): the first token whose cumulative mass exceeds u * (the row's mass).

    A token of zero mass is never drawn (its cumulative mass equals its predecessor's). A row's draw depends only
    on its probabilities and its generator, not on the rows beside it, so a seeded request draws the same tokens
    in any batch; and the whole batch is drawn in a few vectorised passes instead of one sampling call per row
    (which was most of a CPU decode step for a small model). fp64 keeps the cumulative sums exact enough that
    the drawn distribution is the computed one to ~1e-12 per token."""
    cdf = torch.cumsum(probs_R_V, dim=-1, dtype=torch.float64)
    u = torch.tensor([torch.rand((), generator=g, dtype=torch.float64).item() for g in generators],
                     dtype=torch.float64, device=cdf.device)
    total = cdf[:, -1]
    # strictly below the row's mass, so some token's cumulative mass exceeds it (u * total can round up to it)
    target = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target.unsqueeze(-1), right=True).squeeze(-1)


def sample_batch(logits_B_V: torch.Tensor, params: list[SamplingParams],
                 generators: list[torch.Generator | None],
                 banned: list[frozenset[int] | None] | None = None) -> tuple[list[int], list[float]]:
    """Pick one token per row. Returns (token ids, their logprobs under log_softmax(logits / T)).

    logits_B_V: last-position logits of the batch, any float dtype (computed in fp32).
    params[i] / generators[i]: the row's sampling parameters and private RNG (None for greedy rows).
    banned[i]: ids row i may not sample now (`min_new_tokens` masks EOS and stop tokens); they are removed from
    the distribution before sampling, so the logprobs are those of the masked distribution.
    """
    logits_B_V = logits_B_V.float()
    if banned is not None:
        logits_B_V = mask_tokens(logits_B_V, banned)
    temps = [effective_temperature(p.temperature) for p in params]
    temps_B = torch.tensor(temps, dtype=torch.float32)
    # dividing by T = 1 is exact, so an all-T=1 batch (greedy rows included) skips a pass over [B, V]
    logp_B_V = torch.log_softmax(logits_B_V, dim=-1) if all(t == 1.0 for t in temps) else \
        scaled_logprobs(logits_B_V, temps_B)
    # numpy's argmax: the same first-maximum rule as torch.argmax, and several times faster on CPU
    tokens_B = torch.from_numpy(logits_B_V.numpy().argmax(-1)) if logits_B_V.device.type == "cpu" else \
        torch.argmax(logits_B_V, dim=-1)
    sampled = [i for i, p in enumerate(params) if p.temperature > 0]
    if sampled:
        # the sampling distribution is the one the logprobs are reported under, then top-k/top-p filtered
        probs_S_V = (logp_B_V if len(sampled) == len(params) else logp_B_V[sampled]).exp()
        for j, i in enumerate(sampled):
            if params[i].top_k > 0 or params[i].top_p < 1.0:
                row = filter_top_k_top_p(logits_B_V[i] / temps_B[i], params[i].top_k, params[i].top_p)
                probs_S_V[j] = torch.softmax(row, dim=-1)
        tokens_B[sampled] = draw_inverse_cdf(probs_S_V, [generators[i] for i in sampled])
    chosen = logp_B_V.gather(1, tokens_B.unsqueeze(-1)).squeeze(-1)
    return tokens_B.tolist(), chosen.tolist()


__all__ = ["draw_inverse_cdf", "effective_temperature", "scaled_logprobs", "filter_top_k_top_p", "make_generator",
           "mask_tokens", "sample_batch"]
