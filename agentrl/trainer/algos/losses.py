"""The critic's value loss, the policy losses and their registry.

Every policy loss has one signature, `loss(inputs: PolicyLossInputs, options) -> LossOutputs`, with its own small
options record (`VanillaOptions`, `GspoOptions`, ...) built from the run's `PolicyLossKnobs`; every built-in
loss reports pg_clipfrac, ppo_kl and pg_clipfrac_lower as detached 0-dim tensors over the call's policy tokens.
`POLICY_LOSSES` maps each `actor.policy_loss.loss_mode` to the loss and its options builder; a user's
`package.module:function` loss takes (PolicyLossInputs, PolicyLossKnobs) and returns LossOutputs.
Formulas: verl's `core_algos.py` (clip_cov / kl_cov / cispo too); "Policy 与 Value Update", §5.2 and §8.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from agentrl.trainer.algos.core import LOG_RATIO_CLAMP, agg_loss, masked_mean, masked_sum, resolve_named
from agentrl.trainer.algos.loss_records import LossOutputs, PolicyLossInputs, PolicyLossKnobs

GSPO_LOG_RATIO_MAX = 10.0  # upper clamp of GSPO's token log ratio (verl)


def value_loss(vpreds_B_T: Tensor, returns_B_T: Tensor, old_values_B_T: Tensor, mask_B_T: Tensor,
               cliprange_value: float, agg_mode: str = "token-mean", *, num_tokens: int | Tensor | None = None,
               num_seqs: int | Tensor | None = None, scale_factor: float | None = None) -> tuple[Tensor, Tensor]:
    """Clipped value loss of the critic ("Policy 与 Value Update", §8), to minimise.

    vpreds_B_T: [B, T] current critic values (differentiable); returns_B_T: [B, T] targets (GAE returns);
    old_values_B_T: [B, T] the critic's values before this update; mask_B_T: [B, T]; cliprange_value c >= 0
    (checked by the config, `critic.cliprange_value`).
    vclip = clamp(vpred, old - c, old + c); l = max((vpred - R)^2, (vclip - R)^2); loss = 0.5 * agg_loss(l, ...)
    with the global counts of the mini-batch (`num_tokens`, `num_seqs`, `scale_factor` as in `agg_loss`), so
    summing micro-batch losses gives the mini-batch loss whatever the split.
    Returns (loss, vf_clipfrac): vf_clipfrac is the detached share of this call's masked tokens where the
    clipped error is the larger one. Seed example: old 0.4, new 0.9, return 1.0, c 0.2 -> 0.5 * 0.16 = 0.08.
    """
    vclip = torch.maximum(torch.minimum(vpreds_B_T, old_values_B_T + cliprange_value), old_values_B_T - cliprange_value)
    err_unclipped = (vpreds_B_T - returns_B_T).square()
    err_clipped = (vclip - returns_B_T).square()
    loss = 0.5 * agg_loss(torch.maximum(err_unclipped, err_clipped), mask_B_T, agg_mode, num_tokens=num_tokens,
                          num_seqs=num_seqs, scale_factor=scale_factor)
    with torch.no_grad():
        clipfrac = masked_mean((err_clipped > err_unclipped).to(err_clipped.dtype), mask_B_T)
    return loss, clipfrac.detach()


# ------------------------------------------------------------------------------------------------ policy losses


def _metrics(mask: Tensor, dtype: torch.dtype, clipped: Tensor, ppo_kl: Tensor,
             clipped_lower: Tensor | None = None) -> dict[str, Tensor]:
    zero = torch.zeros((), dtype=dtype, device=mask.device)
    return {"pg_clipfrac": masked_mean(clipped.to(dtype), mask).detach(), "ppo_kl": ppo_kl.detach(),
            "pg_clipfrac_lower": zero if clipped_lower is None else masked_mean(clipped_lower.to(dtype), mask).detach()}


def _clamped_log_ratio(x: PolicyLossInputs) -> Tensor:
    return (x.logprobs_B_T - x.old_logprobs_B_T).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


@dataclass(frozen=True)
class VanillaOptions:
    """`vanilla`: PPO clip range [1 - clip_ratio_low, 1 + clip_ratio_high] and the dual-clip cap clip_ratio_c > 1
    (ranges checked where they are configured, `actor.clip_ratio_*`)."""

    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float = 3.0

    @classmethod
    def from_knobs(cls, k: PolicyLossKnobs) -> VanillaOptions:
        return cls(k.clip_ratio_low, k.clip_ratio_high, k.clip_ratio_c)


def policy_loss_vanilla(x: PolicyLossInputs, o: VanillaOptions) -> LossOutputs:
    """Clipped PPO surrogate with dual clip, to minimise.

    Per token: ratio = exp(clamp(logp - old_logp, -20, 20)); loss = max(-A*ratio, -A*clip(ratio, 1-low, 1+high));
    for A < 0 the loss is further capped at clip_ratio_c * |A| (dual clip); times is_weights; reduced by `x.agg`.
    Metrics: pg_clipfrac (share of tokens where the clipped term is the larger loss), ppo_kl (mean of
    old_logp - logp, clamped: how far this update moved, not the reference KL), pg_clipfrac_lower (share of all
    masked tokens that are A < 0 tokens hit by the dual clip, as verl counts it).
    """
    adv, mask = x.advantages_B_T, x.mask_B_T
    log_ratio = _clamped_log_ratio(x)
    ratio = torch.exp(log_ratio)
    pg_unclipped = -adv * ratio
    pg_clipped = -adv * ratio.clamp(1 - o.clip_ratio_low, 1 + o.clip_ratio_high)
    pg_max = torch.maximum(pg_unclipped, pg_clipped)
    dual_cap = -adv * o.clip_ratio_c
    loss_B_T = torch.where(adv < 0, torch.minimum(pg_max, dual_cap), pg_max)
    loss = x.agg(x.weighted(loss_B_T))
    with torch.no_grad():
        metrics = _metrics(mask, log_ratio.dtype, pg_clipped > pg_unclipped, masked_mean(-log_ratio, mask),
                           (pg_max > dual_cap) & (adv < 0))
    return LossOutputs(loss, metrics)


@dataclass(frozen=True)
class GspoOptions:
    """`gspo`: clip range of the sequence ratio; the paper's 3e-4 / 4e-4 are the defaults."""

    clip_ratio_low: float = 3e-4
    clip_ratio_high: float = 4e-4

    @classmethod
    def from_knobs(cls, k: PolicyLossKnobs) -> GspoOptions:
        return cls(k.clip_ratio_low, k.clip_ratio_high)


def policy_loss_gspo(x: PolicyLossInputs, o: GspoOptions) -> LossOutputs:
    """GSPO (Group Sequence Policy Optimization), to minimise.

    s_i = exp(sum_t m*(logp - old) / |y_i|) (the length-normalised sequence ratio); token ratio
    r_it = exp(min(logp_it - sg(logp_it) + sg(log s_i), 10)), whose value is s_i and whose gradient is that of
    logp_it times s_i; l_it = max(-A*r_it, -A*clip(r_it, 1 - low, 1 + high)); reduced by `x.agg`. verl always
    aggregates GSPO with seq-mean-token-mean; agentrl honours `x.agg_mode` (the paper's objective is
    seq-mean-token-mean). No dual clip; pg_clipfrac_lower is 0. ppo_kl = mean(old - logp), unclamped.
    """
    adv, mask, logprobs = x.advantages_B_T, x.mask_B_T, x.logprobs_B_T
    log_ratio = logprobs - x.old_logprobs_B_T
    lengths_B = mask.to(log_ratio.dtype).sum(-1).clamp_min(1)
    log_seq_ratio_B = masked_sum(log_ratio, mask, dim=-1) / lengths_B
    log_token_ratio = logprobs - logprobs.detach() + log_seq_ratio_B.detach()[:, None]
    ratio = torch.exp(log_token_ratio.clamp(max=GSPO_LOG_RATIO_MAX))
    pg_unclipped = -adv * ratio
    pg_clipped = -adv * ratio.clamp(1 - o.clip_ratio_low, 1 + o.clip_ratio_high)
    loss = x.agg(x.weighted(torch.maximum(pg_unclipped, pg_clipped)))
    with torch.no_grad():
        metrics = _metrics(mask, log_ratio.dtype, pg_clipped > pg_unclipped, masked_mean(-log_ratio, mask))
    return LossOutputs(loss, metrics)


@dataclass(frozen=True)
class CispoOptions:
    """`cispo`: the range [1 - clip_ratio_low, 1 + clip_ratio_high] the (stop-gradient) IS weight is clipped to."""

    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2

    @classmethod
    def from_knobs(cls, k: PolicyLossKnobs) -> CispoOptions:
        return cls(k.clip_ratio_low, k.clip_ratio_high)


def policy_loss_cispo(x: PolicyLossInputs, o: CispoOptions) -> LossOutputs:
    """CISPO (clipped IS-weight policy optimisation, MiniMax-M1), to minimise.

    ratio = exp(clamp(logp - old, -20, 20)); l_t = -sg(clip(ratio, 1 - low, 1 + high)) * A * logp_t: every token
    keeps a gradient (REINFORCE-like), only its weight is clipped. pg_clipfrac: share of tokens whose ratio was
    clipped; pg_clipfrac_lower is 0.
    """
    mask = x.mask_B_T
    log_ratio = _clamped_log_ratio(x)
    ratio = torch.exp(log_ratio)
    clipped_ratio = ratio.clamp(1 - o.clip_ratio_low, 1 + o.clip_ratio_high).detach()
    loss = x.agg(x.weighted(-clipped_ratio * x.advantages_B_T * x.logprobs_B_T))
    with torch.no_grad():
        metrics = _metrics(mask, log_ratio.dtype, ratio != clipped_ratio, masked_mean(-log_ratio, mask))
    return LossOutputs(loss, metrics)


def _centered_product(adv: Tensor, logprobs: Tensor, mask: Tensor) -> Tensor:
    """(A - mean A) * (logp - mean logp) per token, means over the call's masked tokens: the token's share of
    the covariance that drives entropy collapse (Cui et al., 2025)."""
    adv_full = adv.expand_as(logprobs).detach()
    lp = logprobs.detach()
    return (adv_full - masked_mean(adv_full, mask)) * (lp - masked_mean(lp, mask))


@dataclass(frozen=True)
class ClipCovOptions:
    """`clip_cov`: the PPO clip range, the share of tokens whose gradient is dropped and the covariance band
    (clip_cov_lb, clip_cov_ub) they are drawn from; `generator` makes the draw reproducible (None: torch's)."""

    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_cov_ratio: float = 0.0002
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    generator: torch.Generator | None = None

    @classmethod
    def from_knobs(cls, k: PolicyLossKnobs) -> ClipCovOptions:
        return cls(k.clip_ratio_low, k.clip_ratio_high, k.clip_cov_ratio, k.clip_cov_lb, k.clip_cov_ub)


def policy_loss_clip_cov(x: PolicyLossInputs, o: ClipCovOptions) -> LossOutputs:
    """Clip-Cov, to minimise: the vanilla clipped surrogate (no dual clip) with the gradient of a few
    high-covariance tokens dropped.

    Among masked tokens that the PPO clip did not already clip and whose centred product
    cov_t = (A_t - mean A) * (logp_t - mean logp) lies in (clip_cov_lb, clip_cov_ub), max(1, int(clip_cov_ratio
    * N)) are drawn at random (N = this call's masked tokens) and their loss is multiplied by 0. pg_clipfrac:
    share of tokens dropped this way (as verl). Like verl, the means and N are over the call's tokens, so the
    selection depends on how a mini-batch is cut. The log ratio is clamped to [-20, 20] (verl does not clamp here).
    """
    adv, mask, logprobs = x.advantages_B_T, x.mask_B_T, x.logprobs_B_T
    log_ratio = _clamped_log_ratio(x)
    ratio = torch.exp(log_ratio)
    pg_unclipped = -adv * ratio
    pg_clipped = -adv * ratio.clamp(1 - o.clip_ratio_low, 1 + o.clip_ratio_high)
    keep = mask.bool()
    with torch.no_grad():
        cov = _centered_product(adv, logprobs, mask)
        candidates = keep & ~(pg_clipped > pg_unclipped) & (cov > o.clip_cov_lb) & (cov < o.clip_cov_ub)
        flat = torch.nonzero(candidates.reshape(-1)).flatten()
        num_drop = min(max(int(o.clip_cov_ratio * int(keep.sum())), 1), flat.numel())
        perm = torch.randperm(flat.numel(), generator=o.generator, device="cpu")[:num_drop].to(flat.device)
        dropped = torch.zeros(keep.numel(), dtype=torch.bool, device=keep.device)
        dropped[flat[perm]] = True
        dropped = dropped.reshape(keep.shape)
    loss_B_T = torch.where(dropped, torch.zeros_like(pg_clipped), torch.maximum(pg_unclipped, pg_clipped))
    loss = x.agg(x.weighted(loss_B_T))
    with torch.no_grad():
        metrics = _metrics(mask, log_ratio.dtype, dropped, masked_mean(-log_ratio, mask))
    return LossOutputs(loss, metrics)


@dataclass(frozen=True)
class KlCovOptions:
    """`kl_cov`: the share of tokens (largest covariance) given the |log ratio| penalty, and its coefficient."""

    kl_cov_ratio: float = 0.0002
    ppo_kl_coef: float = 0.1

    @classmethod
    def from_knobs(cls, k: PolicyLossKnobs) -> KlCovOptions:
        return cls(k.kl_cov_ratio, k.ppo_kl_coef)


def policy_loss_kl_cov(x: PolicyLossInputs, o: KlCovOptions) -> LossOutputs:
    """KL-Cov, to minimise: the unclipped surrogate -A * ratio, plus ppo_kl_coef * |logp - old| on the
    max(1, int(kl_cov_ratio * N)) masked tokens with the largest centred product (A - mean A)(logp - mean logp).

    No ratio clipping. pg_clipfrac: share of tokens given the penalty; ppo_kl is the usual mean(old - logp)
    (verl reports mean |logp - old| under that name). Selection over the call's tokens, as in verl; the log
    ratio is clamped to [-20, 20].
    """
    adv, mask = x.advantages_B_T, x.mask_B_T
    log_ratio = _clamped_log_ratio(x)
    ratio = torch.exp(log_ratio)
    keep = mask.bool()
    with torch.no_grad():
        cov = torch.where(keep, _centered_product(adv, x.logprobs_B_T, mask), torch.full_like(log_ratio, -torch.inf))
        num_pen = min(max(int(o.kl_cov_ratio * int(keep.sum())), 1), int(keep.sum()))
        penalised = torch.zeros(keep.numel(), dtype=torch.bool, device=keep.device)
        penalised[torch.topk(cov.reshape(-1), num_pen).indices] = True
        penalised = penalised.reshape(keep.shape) & keep
    loss_B_T = -adv * ratio + torch.where(penalised, o.ppo_kl_coef * log_ratio.abs(), torch.zeros_like(log_ratio))
    loss = x.agg(x.weighted(loss_B_T))
    with torch.no_grad():
        metrics = _metrics(mask, log_ratio.dtype, penalised, masked_mean(-log_ratio, mask))
    return LossOutputs(loss, metrics)


@dataclass(frozen=True)
class ReinforceOptions:
    """`reinforce` has no knobs of its own."""

    @classmethod
    def from_knobs(cls, k: PolicyLossKnobs) -> ReinforceOptions:
        return cls()


def policy_loss_reinforce(x: PolicyLossInputs, o: ReinforceOptions) -> LossOutputs:
    """REINFORCE with importance weights, to minimise: l_t = -sg(w_t) * A_t * logp_t (w = is_weights, 1 when
    None). Meant for rollout_correction.bypass_mode, where old_logprobs are the rollout's and w = pi_theta /
    pi_rollout comes from `rollout_is_weights` (truncated or masked); no ratio, no clipping.
    ppo_kl = mean(old - logp): with bypass, the distance from the rollout policy.
    """
    mask = x.mask_B_T
    loss = x.agg(x.weighted(-x.advantages_B_T * x.logprobs_B_T))
    with torch.no_grad():
        log_ratio = _clamped_log_ratio(x)
        metrics = _metrics(mask, log_ratio.dtype, torch.zeros_like(mask, dtype=torch.bool),
                           masked_mean(-log_ratio, mask))
    return LossOutputs(loss, metrics)


# ------------------------------------------------------------------------------------------------- the registry

PolicyLossFn = Callable[[PolicyLossInputs, object], LossOutputs]


class PolicyLoss(NamedTuple):
    """A registry entry: the loss and how it gets its options record from the run's knobs."""

    fn: PolicyLossFn
    options: Callable[[PolicyLossKnobs], object]


def _all_knobs(knobs: PolicyLossKnobs) -> PolicyLossKnobs:
    return knobs


POLICY_LOSSES: dict[str, PolicyLoss] = {
    "vanilla": PolicyLoss(policy_loss_vanilla, VanillaOptions.from_knobs),
    "gspo": PolicyLoss(policy_loss_gspo, GspoOptions.from_knobs),
    "cispo": PolicyLoss(policy_loss_cispo, CispoOptions.from_knobs),
    "clip_cov": PolicyLoss(policy_loss_clip_cov, ClipCovOptions.from_knobs),
    "kl_cov": PolicyLoss(policy_loss_kl_cov, KlCovOptions.from_knobs),
    "reinforce": PolicyLoss(policy_loss_reinforce, ReinforceOptions.from_knobs),
}
# Losses whose ratio is anchored to old_logprobs (pi_old); reinforce only reports a metric with them.
NEEDS_OLD_LOGPROBS = ("vanilla", "gspo", "cispo", "clip_cov", "kl_cov")
_USER_LOSS_SIGNATURE = "(inputs: PolicyLossInputs, options: PolicyLossKnobs) and return LossOutputs"


def check_policy_loss(fn, what: str) -> None:
    """Raise ValueError unless `fn` can be called as fn(inputs, options) (checked once, at config load)."""
    if not callable(fn):
        raise ValueError(f"{what} is not callable")
    try:
        inspect.signature(fn).bind(None, None)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{what} must accept {_USER_LOSS_SIGNATURE}: {e}") from None


@functools.cache
def resolve_policy_loss(name: str) -> PolicyLoss:
    """The `POLICY_LOSSES` entry of `name`, or a `package.module:function` escape hatch (signature checked),
    which receives the run's `PolicyLossKnobs` as its options."""
    if name in POLICY_LOSSES:
        return POLICY_LOSSES[name]
    fn = resolve_named(POLICY_LOSSES, name, "actor.policy_loss.loss_mode", check_policy_loss, _USER_LOSS_SIGNATURE)
    return PolicyLoss(fn, _all_knobs)


__all__ = [
    "NEEDS_OLD_LOGPROBS",
    "POLICY_LOSSES",
    "CispoOptions",
    "ClipCovOptions",
    "GspoOptions",
    "KlCovOptions",
    "PolicyLoss",
    "PolicyLossFn",
    "ReinforceOptions",
    "VanillaOptions",
    "check_policy_loss",
    "policy_loss_cispo",
    "policy_loss_clip_cov",
    "policy_loss_gspo",
    "policy_loss_kl_cov",
    "policy_loss_reinforce",
    "policy_loss_vanilla",
    "resolve_policy_loss",
    "value_loss",
]
