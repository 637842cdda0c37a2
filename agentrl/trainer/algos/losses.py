"""Critic and policy losses beyond vanilla PPO, the policy-loss registry, and the total actor objective.

Every loss of `POLICY_LOSSES` is called by keyword with one set of arguments: logprobs, old_logprobs,
advantages, mask (all [B, T] but advantages [B] or [B, T]), clip_ratio_low, clip_ratio_high, clip_ratio_c,
agg_mode, num_tokens, num_seqs, scale_factor (as `agg_loss`), is_weights ([B, T] rollout-correction weights or
None), plus the loss's own knobs (clip_cov_ratio, ...). Each returns (loss, metrics) with the metrics
pg_clipfrac, ppo_kl and pg_clipfrac_lower as detached 0-dim tensors over the call's policy tokens.
Formulas: verl's `core_algos.py` (clip_cov / kl_cov / cispo too); "Policy 与 Value Update", §5.2 and §8.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping

import torch
from torch import Tensor

from agentrl.trainer.algos.core import (
    LOG_RATIO_CLAMP,
    agg_loss,
    kl_penalty,
    masked_mean,
    masked_sum,
    policy_loss_vanilla,
    resolve_named,
)

GSPO_LOG_RATIO_MAX = 10.0  # upper clamp of GSPO's token log ratio (verl)


def value_loss(vpreds_B_T: Tensor, returns_B_T: Tensor, old_values_B_T: Tensor, mask_B_T: Tensor,
               cliprange_value: float, agg_mode: str = "token-mean", *, num_tokens: int | Tensor | None = None,
               num_seqs: int | Tensor | None = None, scale_factor: float | None = None) -> tuple[Tensor, Tensor]:
    """Clipped value loss of the critic ("Policy 与 Value Update", §8), to minimise.

    vpreds_B_T: [B, T] current critic values (differentiable); returns_B_T: [B, T] targets (GAE returns);
    old_values_B_T: [B, T] the critic's values before this update; mask_B_T: [B, T].
    vclip = clamp(vpred, old - c, old + c); l = max((vpred - R)^2, (vclip - R)^2); loss = 0.5 * agg_loss(l, ...)
    with the global counts of the mini-batch (`num_tokens`, `num_seqs`, `scale_factor` as in `agg_loss`), so
    summing micro-batch losses gives the mini-batch loss whatever the split.
    Returns (loss, vf_clipfrac): vf_clipfrac is the detached share of this call's masked tokens where the
    clipped error is the larger one. Seed example: old 0.4, new 0.9, return 1.0, c 0.2 -> 0.5 * 0.16 = 0.08.
    """
    if cliprange_value < 0:
        raise ValueError(f"cliprange_value must be >= 0, got {cliprange_value}")
    vclip = torch.maximum(torch.minimum(vpreds_B_T, old_values_B_T + cliprange_value), old_values_B_T - cliprange_value)
    err_unclipped = (vpreds_B_T - returns_B_T).square()
    err_clipped = (vclip - returns_B_T).square()
    loss = 0.5 * agg_loss(torch.maximum(err_unclipped, err_clipped), mask_B_T, agg_mode, num_tokens=num_tokens,
                          num_seqs=num_seqs, scale_factor=scale_factor)
    with torch.no_grad():
        clipfrac = masked_mean((err_clipped > err_unclipped).to(err_clipped.dtype), mask_B_T)
    return loss, clipfrac.detach()


# ------------------------------------------------------------------------------------------------ policy losses


def _as_b_t(advantages: Tensor, like: Tensor) -> Tensor:
    adv = advantages[:, None] if advantages.dim() == 1 else advantages
    if adv.shape[0] != like.shape[0] or adv.shape[1] not in (1, like.shape[1]):
        raise ValueError(f"advantages must be [B] or [B, T], got {tuple(advantages.shape)} for logprobs of shape "
                         f"{tuple(like.shape)}")
    return adv


def _weighted(loss_B_T: Tensor, is_weights: Tensor | None) -> Tensor:
    return loss_B_T if is_weights is None else loss_B_T * is_weights.detach()


def _metrics(mask: Tensor, dtype: torch.dtype, clipped: Tensor, ppo_kl: Tensor,
             clipped_lower: Tensor | None = None) -> dict[str, Tensor]:
    zero = torch.zeros((), dtype=dtype, device=mask.device)
    return {"pg_clipfrac": masked_mean(clipped.to(dtype), mask).detach(), "ppo_kl": ppo_kl.detach(),
            "pg_clipfrac_lower": zero if clipped_lower is None else masked_mean(clipped_lower.to(dtype), mask).detach()}


def policy_loss_gspo(
    old_logprobs: Tensor, logprobs: Tensor, advantages: Tensor, mask: Tensor, clip_ratio_low: float = 3e-4,
    clip_ratio_high: float = 4e-4, agg_mode: str = "seq-mean-token-mean", *, clip_ratio_c: float | None = None,
    num_tokens: int | Tensor | None = None, num_seqs: int | Tensor | None = None, scale_factor: float | None = None,
    is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:  # fmt: skip
    """GSPO (Group Sequence Policy Optimization), to minimise. Shapes as `policy_loss_vanilla` (mask [B, T]).

    s_i = exp(sum_t m*(logp - old) / |y_i|) (the length-normalised sequence ratio); token ratio
    r_it = exp(min(logp_it - sg(logp_it) + sg(log s_i), 10)), whose value is s_i and whose gradient is that of
    logp_it times s_i; l_it = max(-A*r_it, -A*clip(r_it, 1 - low, 1 + high)); aggregated with `agg_mode`. The
    paper's clip ranges are 3e-4 / 4e-4 (the defaults here). verl always aggregates GSPO with
    seq-mean-token-mean; agentrl honours `agg_mode` (default seq-mean-token-mean). No dual clip
    (`clip_ratio_c` is accepted and ignored); pg_clipfrac_lower is 0. ppo_kl = mean(old - logp), unclamped.
    """
    adv = _as_b_t(advantages, logprobs)
    log_ratio = logprobs - old_logprobs
    lengths_B = mask.to(log_ratio.dtype).sum(-1).clamp_min(1)
    log_seq_ratio_B = masked_sum(log_ratio, mask, dim=-1) / lengths_B
    log_token_ratio = logprobs - logprobs.detach() + log_seq_ratio_B.detach()[:, None]
    ratio = torch.exp(log_token_ratio.clamp(max=GSPO_LOG_RATIO_MAX))
    pg_unclipped = -adv * ratio
    pg_clipped = -adv * ratio.clamp(1 - clip_ratio_low, 1 + clip_ratio_high)
    loss_B_T = _weighted(torch.maximum(pg_unclipped, pg_clipped), is_weights)
    loss = agg_loss(loss_B_T, mask, agg_mode, num_tokens=num_tokens, num_seqs=num_seqs, scale_factor=scale_factor)
    with torch.no_grad():
        metrics = _metrics(mask, log_ratio.dtype, pg_clipped > pg_unclipped, masked_mean(-log_ratio, mask))
    return loss, metrics


def policy_loss_cispo(
    old_logprobs: Tensor, logprobs: Tensor, advantages: Tensor, mask: Tensor, clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2, agg_mode: str = "token-mean", *, clip_ratio_c: float | None = None,
    num_tokens: int | Tensor | None = None, num_seqs: int | Tensor | None = None, scale_factor: float | None = None,
    is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:  # fmt: skip
    """CISPO (clipped IS-weight policy optimisation, MiniMax-M1), to minimise.

    ratio = exp(clamp(logp - old, -20, 20)); l_t = -sg(clip(ratio, 1 - low, 1 + high)) * A * logp_t: every token
    keeps a gradient (REINFORCE-like), only its weight is clipped. pg_clipfrac: share of tokens whose ratio was
    clipped; pg_clipfrac_lower is 0; `clip_ratio_c` is ignored.
    """
    adv = _as_b_t(advantages, logprobs)
    log_ratio = (logprobs - old_logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    clipped_ratio = ratio.clamp(1 - clip_ratio_low, 1 + clip_ratio_high).detach()
    loss_B_T = _weighted(-clipped_ratio * adv * logprobs, is_weights)
    loss = agg_loss(loss_B_T, mask, agg_mode, num_tokens=num_tokens, num_seqs=num_seqs, scale_factor=scale_factor)
    with torch.no_grad():
        metrics = _metrics(mask, log_ratio.dtype, ratio != clipped_ratio, masked_mean(-log_ratio, mask))
    return loss, metrics


def _centered_product(adv: Tensor, logprobs: Tensor, mask: Tensor) -> Tensor:
    """(A - mean A) * (logp - mean logp) per token, means over the call's masked tokens: the token's share of
    the covariance that drives entropy collapse (Cui et al., 2025)."""
    adv_full = adv.expand_as(logprobs).detach()
    lp = logprobs.detach()
    return (adv_full - masked_mean(adv_full, mask)) * (lp - masked_mean(lp, mask))


def policy_loss_clip_cov(
    old_logprobs: Tensor, logprobs: Tensor, advantages: Tensor, mask: Tensor, clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2, agg_mode: str = "token-mean", *, clip_ratio_c: float | None = None,
    num_tokens: int | Tensor | None = None, num_seqs: int | Tensor | None = None, scale_factor: float | None = None,
    is_weights: Tensor | None = None, clip_cov_ratio: float = 0.0002, clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0, generator: torch.Generator | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:  # fmt: skip
    """Clip-Cov, to minimise: the vanilla clipped surrogate (no dual clip) with the gradient of a few
    high-covariance tokens dropped.

    Among masked tokens that the PPO clip did not already clip and whose centred product
    cov_t = (A_t - mean A) * (logp_t - mean logp) lies in (clip_cov_lb, clip_cov_ub), max(1, int(clip_cov_ratio
    * N)) are drawn at random (N = this call's masked tokens; `generator` for reproducibility) and their loss is
    multiplied by 0. pg_clipfrac: share of tokens dropped this way (as verl). Like verl, the means and N are
    over the call's tokens, so the selection depends on how a mini-batch is cut. The log ratio is clamped to
    [-20, 20] (verl does not clamp here).
    """
    adv = _as_b_t(advantages, logprobs)
    log_ratio = (logprobs - old_logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    pg_unclipped = -adv * ratio
    pg_clipped = -adv * ratio.clamp(1 - clip_ratio_low, 1 + clip_ratio_high)
    keep = mask.bool()
    with torch.no_grad():
        cov = _centered_product(adv, logprobs, mask)
        candidates = keep & ~(pg_clipped > pg_unclipped) & (cov > clip_cov_lb) & (cov < clip_cov_ub)
        flat = torch.nonzero(candidates.reshape(-1)).flatten()
        num_drop = min(max(int(clip_cov_ratio * int(keep.sum())), 1), flat.numel())
        perm = torch.randperm(flat.numel(), generator=generator, device="cpu")[:num_drop].to(flat.device)
        dropped = torch.zeros(keep.numel(), dtype=torch.bool, device=keep.device)
        dropped[flat[perm]] = True
        dropped = dropped.reshape(keep.shape)
    loss_B_T = torch.where(dropped, torch.zeros_like(pg_clipped), torch.maximum(pg_unclipped, pg_clipped))
    loss = agg_loss(_weighted(loss_B_T, is_weights), mask, agg_mode, num_tokens=num_tokens, num_seqs=num_seqs,
                    scale_factor=scale_factor)
    with torch.no_grad():
        metrics = _metrics(mask, log_ratio.dtype, dropped, masked_mean(-log_ratio, mask))
    return loss, metrics


def policy_loss_kl_cov(
    old_logprobs: Tensor, logprobs: Tensor, advantages: Tensor, mask: Tensor, clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2, agg_mode: str = "token-mean", *, clip_ratio_c: float | None = None,
    num_tokens: int | Tensor | None = None, num_seqs: int | Tensor | None = None, scale_factor: float | None = None,
    is_weights: Tensor | None = None, kl_cov_ratio: float = 0.0002, ppo_kl_coef: float = 0.1,
) -> tuple[Tensor, dict[str, Tensor]]:  # fmt: skip
    """KL-Cov, to minimise: the unclipped surrogate -A * ratio, plus ppo_kl_coef * |logp - old| on the
    max(1, int(kl_cov_ratio * N)) masked tokens with the largest centred product (A - mean A)(logp - mean logp).

    No ratio clipping (`clip_ratio_*` are accepted and ignored). pg_clipfrac: share of tokens given the
    penalty; ppo_kl is the usual mean(old - logp) (verl reports mean |logp - old| under that name). Selection
    over the call's tokens, as in verl; the log ratio is clamped to [-20, 20].
    """
    adv = _as_b_t(advantages, logprobs)
    log_ratio = (logprobs - old_logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    keep = mask.bool()
    with torch.no_grad():
        cov = torch.where(keep, _centered_product(adv, logprobs, mask), torch.full_like(log_ratio, -torch.inf))
        num_pen = min(max(int(kl_cov_ratio * int(keep.sum())), 1), int(keep.sum()))
        penalised = torch.zeros(keep.numel(), dtype=torch.bool, device=keep.device)
        penalised[torch.topk(cov.reshape(-1), num_pen).indices] = True
        penalised = penalised.reshape(keep.shape) & keep
    loss_B_T = -adv * ratio + torch.where(penalised, ppo_kl_coef * log_ratio.abs(), torch.zeros_like(log_ratio))
    loss = agg_loss(_weighted(loss_B_T, is_weights), mask, agg_mode, num_tokens=num_tokens, num_seqs=num_seqs,
                    scale_factor=scale_factor)
    with torch.no_grad():
        metrics = _metrics(mask, log_ratio.dtype, penalised, masked_mean(-log_ratio, mask))
    return loss, metrics


def policy_loss_reinforce(
    old_logprobs: Tensor, logprobs: Tensor, advantages: Tensor, mask: Tensor, clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None, agg_mode: str = "token-mean", *, clip_ratio_c: float | None = None,
    num_tokens: int | Tensor | None = None, num_seqs: int | Tensor | None = None, scale_factor: float | None = None,
    is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:  # fmt: skip
    """REINFORCE with importance weights, to minimise: l_t = -sg(w_t) * A_t * logp_t (w = `is_weights`, 1 when
    None). Meant for rollout_correction.bypass_mode, where old_logprobs are the rollout's and w = pi_theta /
    pi_rollout comes from `rollout_is_weights` (truncated or masked); no ratio, no clipping (`clip_ratio_*`
    ignored). ppo_kl = mean(old - logp): with bypass, the distance from the rollout policy.
    """
    adv = _as_b_t(advantages, logprobs)
    loss_B_T = _weighted(-adv * logprobs, is_weights)
    loss = agg_loss(loss_B_T, mask, agg_mode, num_tokens=num_tokens, num_seqs=num_seqs, scale_factor=scale_factor)
    with torch.no_grad():
        log_ratio = (logprobs - old_logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        metrics = _metrics(mask, log_ratio.dtype, torch.zeros_like(mask, dtype=torch.bool),
                           masked_mean(-log_ratio, mask))
    return loss, metrics


PolicyLossFn = Callable[..., tuple[Tensor, dict[str, Tensor]]]
POLICY_LOSSES: dict[str, PolicyLossFn] = {
    "vanilla": policy_loss_vanilla,
    "gspo": policy_loss_gspo,
    "cispo": policy_loss_cispo,
    "clip_cov": policy_loss_clip_cov,
    "kl_cov": policy_loss_kl_cov,
    "reinforce": policy_loss_reinforce,
}
# Losses whose ratio is anchored to old_logprobs (pi_old); reinforce only reports a metric with them.
NEEDS_OLD_LOGPROBS = ("vanilla", "gspo", "cispo", "clip_cov", "kl_cov")
_COMMON_ARGS = ("logprobs", "old_logprobs", "advantages", "mask", "clip_ratio_low", "clip_ratio_high",
                "clip_ratio_c", "agg_mode", "num_tokens", "num_seqs", "scale_factor", "is_weights")


def check_policy_loss(fn, what: str) -> None:
    """Raise ValueError unless `fn` accepts every common keyword argument of a policy loss."""
    if not callable(fn):
        raise ValueError(f"{what} is not callable")
    try:
        inspect.signature(fn).bind(**dict.fromkeys(_COMMON_ARGS))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{what} must accept the keyword arguments {', '.join(_COMMON_ARGS)} and return "
                         f"(loss, metrics): {e}") from None


@functools.cache
def resolve_policy_loss(name: str) -> PolicyLossFn:
    """A name of `POLICY_LOSSES` or a `package.module:function` escape hatch (signature checked)."""
    return resolve_named(POLICY_LOSSES, name, "actor.policy_loss.loss_mode", check_policy_loss,
                         f"the keyword arguments {', '.join(_COMMON_ARGS)}")


@functools.cache
def _declared_options(fn: PolicyLossFn) -> frozenset[str] | None:
    """The parameter names `fn` takes beyond the common ones (None: it takes **kwargs, so every option)."""
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    return frozenset(params) - frozenset(_COMMON_ARGS)


# ------------------------------------------------------------------------------------------------ the objective


def ppo_objective(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, *, loss_mode: str = "vanilla",
    loss_options: Mapping[str, float] | None = None, clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0, agg_mode: str = "token-mean", num_tokens: int | Tensor | None = None,
    num_seqs: int | Tensor | None = None, scale_factor: float | None = None, is_weights: Tensor | None = None,
    ref_logprobs: Tensor | None = None, kl_loss_coef: float = 0.0, kl_loss_type: str = "low_var_kl",
    entropy: Tensor | None = None, entropy_coeff: float = 0.0,
) -> tuple[Tensor, dict[str, Tensor]]:  # fmt: skip
    """The actor's loss for one micro-batch ("Policy 与 Value Update", §5), to minimise:

        loss = pg(loss_mode; is_weights) + kl_loss_coef * agg(kl_penalty(logp, ref, kl_loss_type)) - entropy_coeff * agg(H)

    every term aggregated with `agg_mode` over the GLOBAL counts of the mini-batch (`num_tokens`, `num_seqs`,
    `scale_factor`, as `agg_loss`), so summing the micro-batch losses gives the mini-batch objective.
    logprobs / old_logprobs / mask / is_weights / ref_logprobs / entropy: [B, T]; advantages [B] or [B, T].
    `loss_mode`: a `POLICY_LOSSES` name or `module:function`; `loss_options` are that loss's own knobs
    (clip_cov_ratio, ...), each passed only if the loss declares it. The rollout-correction weights
    `is_weights` multiply only the policy-gradient token losses, not ppo_kl, the KL or the entropy term.
    The KL term is on when `ref_logprobs` is given, the entropy term when `entropy` is given (entropy_coeff 0
    still reports it).
    Metrics (detached 0-dim tensors): pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower; with the KL kl_loss and
    kl (mean per policy token); with entropy entropy_loss and entropy (mean per policy token).
    """
    fn = resolve_policy_loss(loss_mode)
    declared = _declared_options(fn)
    options = {k: v for k, v in (loss_options or {}).items() if declared is None or k in declared}
    agg = {"num_tokens": num_tokens, "num_seqs": num_seqs, "scale_factor": scale_factor}
    pg_loss, pg_stats = fn(logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages, mask=mask,
                           clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high, clip_ratio_c=clip_ratio_c,
                           agg_mode=agg_mode, is_weights=is_weights, **agg, **options)
    loss = pg_loss
    stats = {"pg_loss": pg_loss.detach(), **pg_stats}
    tokens = mask.to(logprobs.dtype).sum().clamp_min(1)
    if ref_logprobs is not None:
        kl = kl_penalty(logprobs, ref_logprobs, kl_loss_type)
        kl_loss = agg_loss(kl, mask, agg_mode, **agg)
        loss = loss + kl_loss_coef * kl_loss
        stats["kl_loss"] = kl_loss.detach()
        stats["kl"] = masked_sum(kl.detach(), mask) / tokens
    if entropy is not None:
        ent_loss = agg_loss(entropy, mask, agg_mode, **agg)
        if entropy_coeff != 0:
            loss = loss - entropy_coeff * ent_loss
        stats["entropy_loss"] = ent_loss.detach()
        stats["entropy"] = masked_sum(entropy.detach(), mask) / tokens
    return loss, stats


__all__ = [
    "NEEDS_OLD_LOGPROBS",
    "POLICY_LOSSES",
    "PolicyLossFn",
    "check_policy_loss",
    "policy_loss_cispo",
    "policy_loss_clip_cov",
    "policy_loss_gspo",
    "policy_loss_kl_cov",
    "policy_loss_reinforce",
    "ppo_objective",
    "resolve_policy_loss",
    "value_loss",
]
