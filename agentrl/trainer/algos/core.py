"""RL math core: masked reductions, GRPO advantages, reference-KL estimators, loss aggregation, and
memory-frugal log-probabilities / entropy from logits.

Pure functions over torch tensors: no models, no config objects. Formulas follow verl's `core_algos.py`
(GRPO advantages, the KL estimators, `agg_loss`); deliberate differences are
stated where they occur.
Shape suffixes: B trajectories, T response tokens (padded), V vocabulary. Masks are 0/1 tensors (bool, int or
float) shaped like the tensor they select from; 1 marks a token sampled by the policy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Literal, get_args

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

LOG_RATIO_CLAMP = 20.0  # |log ratio| bound before exp(): keeps ratios finite
LOW_VAR_KL_CLAMP = 10.0  # bound on the k3 estimator's value
LossAggMode = Literal["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
AGG_MODES: tuple[str, ...] = get_args(LossAggMode)
DEFAULT_CHUNK_ELEMENTS = 1 << 25  # logits entries upcast at once by the chunked softmax helpers (128 MiB fp32)


# ------------------------------------------------------------------------------------------------- registries


def resolve_named(registry: Mapping[str, Callable], name: str, key: str, check: Callable[[Callable, str], None],
                  takes: str) -> Callable:
    """`registry[name]`, or a `package.module:function` escape hatch imported and passed through `check`;
    `key` is the config key for messages, `takes` says what the function must accept."""
    if name in registry:
        return registry[name]
    if ":" not in name:
        raise ValueError(f"{key} {name!r} is unknown; choose one of {', '.join(registry)} or give a "
                         f"'package.module:function' taking {takes}")
    from agentrl.config import import_object

    fn = import_object(name, key)
    check(fn, f"{key} ({name})")
    return fn


# ---------------------------------------------------------------------------------------------- masked reductions


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of `x` where `mask` is 1; masked-out entries never reach the result, even when they are inf or nan."""
    kept = torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype, device=x.device))
    return kept.sum() if dim is None else kept.sum(dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of `x` over entries where `mask` is 1 (over `dim`, or all entries). An empty selection gives 0."""
    count = mask.to(x.dtype).sum() if dim is None else mask.to(x.dtype).sum(dim)
    return masked_sum(x, mask, dim) / count.clamp_min(1)


def masked_var(x: Tensor, mask: Tensor) -> Tensor:
    """Unbiased (Bessel-corrected) variance of the entries of `x` where `mask` is 1; needs at least 2 of them."""
    count = int(mask.bool().sum())
    if count < 2:
        raise ValueError(f"masked_var needs at least 2 selected entries for an unbiased variance, got {count}")
    centered = x - masked_mean(x, mask)
    return masked_sum(centered.square(), mask) / (count - 1)


def masked_whiten(x: Tensor, mask: Tensor, shift_mean: bool = True) -> Tensor:
    """(x - mean) / sqrt(var + 1e-8) over the selected entries (unbiased variance); with `shift_mean=False` the
    mean is added back (only the scale changes). Entries where `mask` is 0 come back as 0."""
    mean = masked_mean(x, mask)
    whitened = (x - mean) * torch.rsqrt(masked_var(x, mask) + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(mask.bool(), whitened, torch.zeros((), dtype=whitened.dtype, device=whitened.device))


# ---------------------------------------------------------------------------------------------------- advantages


def _group_index(group_ids: Sequence | Tensor, size: int, device: torch.device) -> Tensor:
    """Map arbitrary group ids (strings, ints, or a tensor) to dense indices 0..G-1, as a [B] int64 tensor."""
    if len(group_ids) != size:
        raise ValueError(f"group_ids has {len(group_ids)} entries but scores has {size}: one id per trajectory")
    if isinstance(group_ids, Tensor):
        return torch.unique(group_ids.to(device), return_inverse=True)[1].reshape(-1)
    dense: dict = {}
    return torch.tensor([dense.setdefault(gid, len(dense)) for gid in group_ids], dtype=torch.long, device=device)


def grpo_advantages(
    scores_B: Tensor, group_ids: Sequence | Tensor, *, norm_by_std: bool = True, eps: float = 1e-6
) -> Tensor:
    """GRPO outcome advantages, one scalar per trajectory.

    scores_B: [B] reward of each trajectory (sum of its token rewards), in reward units.
    group_ids: B ids (list of str/int, or a [B] tensor); trajectories sharing an id are samples of one prompt.
    Returns adv_B [B] (dtype of `scores_B`, float32 for integer scores):
    (score - group mean) / (group std + eps), std the unbiased (Bessel) estimator; with `norm_by_std=False`
    it is score - group mean (Dr.GRPO). A group of one trajectory gets advantage 0 (no peer, no baseline, no
    learning signal; verl instead uses mean 0 / std 1, i.e. the raw score). A group whose scores are all equal
    gets 0 too. Use `broadcast_advantages` to spread the result over response tokens.
    """
    if scores_B.dim() != 1:
        raise ValueError(f"scores_B must be 1-D [B], got shape {tuple(scores_B.shape)}")
    scores = scores_B if scores_B.is_floating_point() else scores_B.float()
    if not bool(torch.isfinite(scores).all()):
        bad = torch.nonzero(~torch.isfinite(scores)).flatten().tolist()
        raise ValueError(f"scores_B has non-finite rewards at trajectories {bad}; fix the reward function")
    index = _group_index(group_ids, scores.shape[0], scores.device)
    num_groups = int(index.max()) + 1 if index.numel() else 0
    zeros = torch.zeros(num_groups, dtype=scores.dtype, device=scores.device)
    counts = zeros.index_add(0, index, torch.ones_like(scores))
    centered = scores - (zeros.index_add(0, index, scores) / counts)[index]
    adv = centered
    if norm_by_std:
        var = zeros.index_add(0, index, centered.square()) / (counts - 1).clamp_min(1)
        adv = centered / (var.sqrt()[index] + eps)
    return torch.where(counts[index] > 1, adv, torch.zeros_like(adv))


def broadcast_advantages(adv_B: Tensor, mask_B_T: Tensor) -> Tensor:
    """[B] per-trajectory advantages -> [B, T]: the trajectory's value on its policy tokens, 0 elsewhere."""
    return adv_B[:, None] * mask_B_T.to(adv_B.dtype)


# ------------------------------------------------------------------------------------------------ KL estimators


def _k3(d: Tensor) -> Tensor:
    d = d.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return (torch.exp(-d) + d - 1).clamp(-LOW_VAR_KL_CLAMP, LOW_VAR_KL_CLAMP)


def _k2(d: Tensor) -> Tensor:
    return 0.5 * d.square()


# The estimators by name; a "+" suffix makes one straight-through (see `kl_penalty`).
KLKind = Literal["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3",
                 "kl+", "k1+", "abs+", "mse+", "k2+", "low_var_kl+", "k3+"]
KL_KINDS: tuple[str, ...] = get_args(KLKind)
_KL_ESTIMATORS = {"kl": lambda d: d, "k1": lambda d: d, "abs": torch.abs, "mse": _k2, "k2": _k2,
                  "low_var_kl": _k3, "k3": _k3}


def kl_penalty(logprobs_B_T: Tensor, ref_logprobs_B_T: Tensor, kind: str = "low_var_kl") -> Tensor:
    """Per-token estimate of KL(policy || reference) on sampled tokens, [B, T] (nats), with d = logp - ref_logp.

    kind: "kl"/"k1": d; "abs": |d|; "mse"/"k2": d^2/2; "low_var_kl"/"k3": exp(-d) + d - 1 with d clamped to
    [-20, 20] and the result clamped to [-10, 10]. A "+" suffix ("k1+", "k3+", ...) is straight-through: the
    value of that estimator with the gradient of k2 (d), whose expected gradient is the true KL gradient.
    Aggregate the result with `agg_loss(kl, mask, ...)`; positions where the mask is 0 are not zeroed here.
    """
    if kind not in KL_KINDS:
        raise ValueError(f"unknown KL kind {kind!r}; valid kinds: {', '.join(KL_KINDS)}")
    d = logprobs_B_T - ref_logprobs_B_T
    value = _KL_ESTIMATORS[kind.removesuffix("+")](d)
    if not kind.endswith("+"):
        return value
    k2 = _k2(d)
    return k2 - k2.detach() + value.detach()


# --------------------------------------------------------------------------------------------- loss aggregation


def _count(value: int | float | Tensor | None, local: Tensor | int, like: Tensor) -> Tensor:
    count = local if value is None else value
    return torch.as_tensor(count, dtype=like.dtype, device=like.device).clamp_min(1)


def agg_loss(
    loss_B_T: Tensor, mask_B_T: Tensor, mode: str = "token-mean", *, num_tokens: int | Tensor | None = None,
    num_seqs: int | Tensor | None = None, scale_factor: float | None = None,
) -> Tensor:  # fmt: skip
    """Reduce a per-token loss matrix [B, T] to a scalar; only tokens with mask 1 contribute.

    With l the token loss, m the mask, N = num_tokens and S = num_seqs:
      token-mean               sum(m*l) / N
      token-sum                sum(m*l)
      seq-mean-token-sum       sum_i sum_t(m*l) / S
      seq-mean-token-mean      sum_i [sum_t(m*l) / T_i] / S   (T_i = sum_t m; empty rows add 0; exact mean,
                                                               verl divides by T_i + 1e-8)
      seq-mean-token-sum-norm  sum_i sum_t(m*l) / scale_factor / S
    N and S are the GLOBAL counts of the mini-batch (loss tokens, trajectories including all-masked padding
    rows), so the micro-batch losses summed (gradient accumulation) give the mini-batch objective whatever the
    split. When None they default to this call's own counts (right only when the call sees the whole
    mini-batch). Counts below 1 are treated as 1 (an empty batch gives 0). If N / S count tokens over D
    data-parallel ranks whose gradients are averaged (FSDP's default), multiply the loss by D.
    seq-mean-token-sum-norm requires `scale_factor` (e.g. the maximum response length): falling back to the
    padded horizon, as verl does, makes the loss depend on how micro-batches are padded.
    """
    if loss_B_T.dim() != 2 or loss_B_T.shape != mask_B_T.shape:
        shapes = f"{tuple(loss_B_T.shape)} and {tuple(mask_B_T.shape)}"
        raise ValueError(f"agg_loss wants loss and mask of the same [B, T] shape, got {shapes}")
    token_sums_B = masked_sum(loss_B_T, mask_B_T, dim=-1)
    if mode == "token-sum":
        return token_sums_B.sum()
    if mode == "token-mean":
        return token_sums_B.sum() / _count(num_tokens, mask_B_T.to(loss_B_T.dtype).sum(), loss_B_T)
    if mode == "seq-mean-token-sum":
        per_seq_B = token_sums_B
    elif mode == "seq-mean-token-mean":
        per_seq_B = token_sums_B / mask_B_T.to(loss_B_T.dtype).sum(-1).clamp_min(1)
    elif mode == "seq-mean-token-sum-norm":
        if scale_factor is None or scale_factor <= 0:
            raise ValueError(
                f"agg_loss mode 'seq-mean-token-sum-norm' needs a positive scale_factor (e.g. the max response "
                f"length), got {scale_factor!r}"
            )
        per_seq_B = token_sums_B / scale_factor
    else:
        raise ValueError(f"unknown loss aggregation mode {mode!r}; valid modes: {', '.join(AGG_MODES)}")
    return per_seq_B.sum() / _count(num_seqs, loss_B_T.shape[0], loss_B_T)


# ------------------------------------------------------------------------------- log-probs / entropy from logits
# Both helpers upcast and softmax only one chunk of rows at a time and save just the logits plus a few [rows]
# statistics for backward (recomputing the softmax there), so no second [rows, V] tensor per token is ever held
# (torch.log_softmax keeps its full-size output alive for backward). Logits must be finite.


def _chunks(num_b: int, num_t: int, vocab: int, max_elements: int) -> Iterator[tuple[slice, slice]]:
    """Blocks of [B, T] positions holding at most max(max_elements, vocab) logits entries each."""
    step_t = min(num_t, max(1, max_elements // vocab))
    step_b = max(1, max_elements // (step_t * vocab)) if step_t == num_t else 1
    for b in range(0, num_b, step_b):
        for t in range(0, num_t, step_t):
            yield slice(b, b + step_b), slice(t, t + step_t)


def _scaled(logits_chunk: Tensor, temperature: float) -> Tensor:
    """The chunk in at least float32, divided by the temperature (may alias the input: do not modify in place)."""
    z = logits_chunk.to(torch.promote_types(logits_chunk.dtype, torch.float32))
    return z if temperature == 1.0 else z / temperature


class _LogProbs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, labels, temperature: float, max_elements: int):
        out = torch.empty(labels.shape, dtype=torch.promote_types(logits.dtype, torch.float32), device=logits.device)
        lse = torch.empty_like(out)
        for bs, ts in _chunks(*logits.shape, max_elements):
            z = _scaled(logits[bs, ts], temperature)
            lse[bs, ts] = torch.logsumexp(z, dim=-1)
            out[bs, ts] = z.gather(-1, labels[bs, ts, None]).squeeze(-1) - lse[bs, ts]
        ctx.save_for_backward(logits, labels, lse)
        ctx.temperature, ctx.max_elements = temperature, max_elements
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        return _logprob_grad(ctx, grad_out), None, None, None


class _LogProbsWithEntropy(torch.autograd.Function):
    """`_LogProbs` that also returns the entropy per position as a statistic (no gradient), from the same
    exp pass: one logsumexp instead of two. The same backward (`_logprob_grad`)."""

    @staticmethod
    def forward(ctx, logits, labels, temperature: float, max_elements: int, with_entropy: bool):
        dtype = torch.promote_types(logits.dtype, torch.float32)
        out = torch.empty(labels.shape, dtype=dtype, device=logits.device)
        lse = torch.empty_like(out)
        entropy = torch.empty_like(out) if with_entropy else None
        for bs, ts in _chunks(*logits.shape, max_elements):
            z = _scaled(logits[bs, ts], temperature)
            peak = z.amax(dim=-1, keepdim=True)
            e = (z - peak).exp_()
            total = e.sum(dim=-1)
            lse[bs, ts] = peak.squeeze(-1) + total.log()
            out[bs, ts] = z.gather(-1, labels[bs, ts, None]).squeeze(-1) - lse[bs, ts]
            if with_entropy:  # H = lse - E_p[z]
                entropy[bs, ts] = lse[bs, ts] - torch.linalg.vecdot(e, z) / total
        ctx.save_for_backward(logits, labels, lse)
        ctx.temperature, ctx.max_elements = temperature, max_elements
        ctx.mark_non_differentiable(*([entropy] if with_entropy else []))
        return out, entropy

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out, _grad_entropy):
        return _logprob_grad(ctx, grad_out), None, None, None, None


def _logprob_grad(ctx, grad_out: Tensor) -> Tensor:
    """d sum(grad_out * log p_label) / d logits from the saved (logits, labels, lse), chunk by chunk: written
    straight into the output chunk when the logits are float32/64 (no temporary [rows, V] tensor)."""
    logits, labels, lse = ctx.saved_tensors
    grad = torch.empty_like(logits)
    for bs, ts in _chunks(*logits.shape, ctx.max_elements):
        g_out = grad_out[bs, ts, None].to(lse.dtype)
        if grad.dtype == lse.dtype:
            g = grad[bs, ts]
            torch.sub(_scaled(logits[bs, ts], ctx.temperature), lse[bs, ts, None], out=g)
            g.exp_().mul_(-g_out)
        else:
            g = (_scaled(logits[bs, ts], ctx.temperature) - lse[bs, ts, None]).exp_().mul_(-g_out)
        g.scatter_add_(-1, labels[bs, ts, None], g_out)  # d log p_y / dz = onehot(y) - softmax(z)
        if ctx.temperature != 1.0:
            g.div_(ctx.temperature)
        if grad.dtype != lse.dtype:
            grad[bs, ts] = g
    return grad


class _Entropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, temperature: float, max_elements: int):
        shape = logits.shape[:-1]
        out = torch.empty(shape, dtype=torch.promote_types(logits.dtype, torch.float32), device=logits.device)
        lse = torch.empty_like(out)
        for bs, ts in _chunks(*logits.shape, max_elements):
            z = _scaled(logits[bs, ts], temperature)
            lse[bs, ts] = torch.logsumexp(z, dim=-1)
            out[bs, ts] = lse[bs, ts] - (z - lse[bs, ts, None]).exp_().mul_(z).sum(-1)
        ctx.save_for_backward(logits, lse, out)
        ctx.temperature, ctx.max_elements = temperature, max_elements
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        logits, lse, entropy = ctx.saved_tensors
        grad = torch.empty_like(logits)
        for bs, ts in _chunks(*logits.shape, ctx.max_elements):
            log_p = _scaled(logits[bs, ts], ctx.temperature) - lse[bs, ts, None]
            # dH/dz_k = -p_k * (log p_k + H)
            g = torch.exp(log_p).mul_(log_p.add_(entropy[bs, ts, None])).mul_(-grad_out[bs, ts, None].to(lse.dtype))
            grad[bs, ts] = g.div_(ctx.temperature)
        return grad, None, None


def _as_b_t_v(logits: Tensor, temperature: float) -> Tensor:
    if temperature <= 0:
        hint = "train with the sampling temperature, and use 1.0 for greedy (temperature 0) rollouts"
        raise ValueError(f"temperature must be > 0, got {temperature}; {hint}")
    if logits.dim() < 2:
        raise ValueError(f"logits must be [..., V], got shape {tuple(logits.shape)}")
    return logits.unsqueeze(0) if logits.dim() == 2 else logits.reshape(-1, *logits.shape[-2:])


def logprobs_from_logits(
    logits: Tensor, labels: Tensor, temperature: float = 1.0, *, max_chunk_elements: int = DEFAULT_CHUNK_ELEMENTS
) -> Tensor:
    """log softmax(logits / temperature)[label]: logits [..., V] (e.g. [B, T, V]), labels [...] int64 valid ids.

    Returns [...] log-probabilities in nats, float32 (float64 for float64 logits), differentiable w.r.t. logits.
    `temperature` must be the sampling temperature of the rollout (> 0; greedy rollouts train with 1.0).
    """
    logits_b_t_v = _as_b_t_v(logits, temperature)
    if labels.shape != logits.shape[:-1]:
        raise ValueError(f"labels shape {tuple(labels.shape)} must equal logits shape without V {tuple(logits.shape)}")
    labels_b_t = labels.reshape(logits_b_t_v.shape[:-1]).long()
    out = _LogProbs.apply(logits_b_t_v, labels_b_t, float(temperature), max_chunk_elements)
    return out.reshape(labels.shape)


def logprobs_and_entropy_from_logits(
    logits: Tensor, labels: Tensor, temperature: float = 1.0, *, with_entropy: bool = True,
    max_chunk_elements: int = DEFAULT_CHUNK_ELEMENTS
) -> tuple[Tensor, Tensor | None]:
    """`logprobs_from_logits` (differentiable) plus, with `with_entropy`, `entropy_from_logits` as a statistic
    without gradient (entropy_coeff 0), both from one softmax pass over the logits."""
    logits_b_t_v = _as_b_t_v(logits, temperature)
    if labels.shape != logits.shape[:-1]:
        raise ValueError(f"labels shape {tuple(labels.shape)} must equal logits shape without V {tuple(logits.shape)}")
    labels_b_t = labels.reshape(logits_b_t_v.shape[:-1]).long()
    logp, entropy = _LogProbsWithEntropy.apply(logits_b_t_v, labels_b_t, float(temperature), max_chunk_elements,
                                               with_entropy)
    return logp.reshape(labels.shape), None if entropy is None else entropy.reshape(labels.shape)


def entropy_from_logits(
    logits: Tensor, temperature: float = 1.0, *, max_chunk_elements: int = DEFAULT_CHUNK_ELEMENTS
) -> Tensor:
    """Entropy of softmax(logits / temperature) per position: logits [..., V] -> [...] in nats, float32 (float64
    for float64 logits), differentiable w.r.t. logits. `temperature` as in `logprobs_from_logits`."""
    out = _Entropy.apply(_as_b_t_v(logits, temperature), float(temperature), max_chunk_elements)
    return out.reshape(logits.shape[:-1])
