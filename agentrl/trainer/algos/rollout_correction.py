"""Rollout correction: importance weights pi_old / pi_rollout for the mismatch between the engine that sampled
and the trainer (TIS truncation or IcePop masking, token or sequence level) and rejection of tokens or
trajectories whose ratio leaves a band ("Policy 与 Value Update", §2-3; verl `rollout_corr_helper.py`).

The weights multiply only the policy-gradient token losses (`ppo_objective(is_weights=...)`), never ppo_kl,
the entropy or the reference KL. Metrics are floats named `rollout_corr/...`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from agentrl.trainer.algos.core import LOG_RATIO_CLAMP, masked_sum

IS_LEVELS = ("token", "sequence")
IS_MODES = ("truncate", "mask")
REJECTION_LEVELS = ("token", "sequence", "geometric")


def _units(values_B_T: Tensor, keep: Tensor, level: str) -> Tensor:
    """One value per unit: every policy token (token level) or every non-empty trajectory (sequence level,
    where the policy tokens of a row share one value >= 0 and mask-0 tokens hold 0)."""
    if level == "token":
        return values_B_T[keep]
    return values_B_T.amax(-1)[keep.any(-1)]


@torch.no_grad()
def rollout_is_weights(log_ratio_B_T: Tensor, mask_B_T: Tensor, level: str = "token",
                       threshold: float | tuple[float, float] = 2.0, *,
                       mode: str | None = None) -> tuple[Tensor, dict[str, float]]:
    """Importance weights [B, T] (detached) from log_ratio = old_logp - rollout_logp (pi_old / pi_rollout; in
    bypass mode with the reinforce loss, logp.detach() - rollout_logp).

    level "token": w_t = exp(clamp(log_ratio_t, -20, 20)); "sequence": w = exp(clamp(sum_t m*log_ratio, -20, 20))
    on every token of the trajectory. Weights are 0 where the mask is 0.
    threshold: a number U -> TIS, w = min(w, U) (mode "truncate"); a pair (L, U) -> IcePop, w = w * [L <= w <= U]
    (mode "mask"). `mode` overrides: "mask" with a number U uses [1/U, U]; "truncate" with a pair uses U.
    Metrics over units (policy tokens, or trajectories at sequence level): rollout_corr/weight_mean, _max, _min
    of the raw weights, rollout_corr/ess = (sum w)^2 / (n * sum w^2) of the corrected weights (1: uniform; 1/n:
    one unit carries everything), rollout_corr/corrected_frac = share of units truncated or masked.
    """
    if level not in IS_LEVELS:
        raise ValueError(f"rollout correction level {level!r} is unknown; choose one of {', '.join(IS_LEVELS)}")
    if isinstance(threshold, (tuple, list)):
        lower, upper = (float(x) for x in threshold)
        mode = mode or "mask"
    else:
        lower, upper = 1.0 / float(threshold), float(threshold)
        mode = mode or "truncate"
    if mode not in IS_MODES:
        raise ValueError(f"rollout correction mode {mode!r} is unknown; choose one of {', '.join(IS_MODES)}")
    if not 0 <= lower < upper:
        raise ValueError(f"rollout correction needs 0 <= lower < upper, got lower={lower}, upper={upper}")
    keep = mask_B_T.bool()
    dtype = torch.promote_types(log_ratio_B_T.dtype, torch.float32)
    log_ratio = torch.where(keep, log_ratio_B_T.to(dtype), torch.zeros((), dtype=dtype, device=keep.device))
    if level == "sequence":
        log_ratio = masked_sum(log_ratio, keep, dim=-1)[:, None].expand_as(log_ratio)
    raw = torch.where(keep, torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)), torch.zeros_like(log_ratio))
    if mode == "truncate":
        weights = raw.clamp(max=upper)
        corrected = raw > upper
    else:
        inside = (raw >= lower) & (raw <= upper)
        weights = torch.where(inside, raw, torch.zeros_like(raw))
        corrected = ~inside
    units_raw, units_w = _units(raw, keep, level), _units(weights, keep, level)
    units_corrected = _units((corrected & keep).to(dtype), keep, level)
    metrics = {"rollout_corr/weight_mean": 0.0, "rollout_corr/weight_max": 0.0, "rollout_corr/weight_min": 0.0,
               "rollout_corr/ess": 0.0, "rollout_corr/corrected_frac": 0.0}
    if units_raw.numel():
        square_sum = float(units_w.square().sum())
        metrics.update({
            "rollout_corr/weight_mean": float(units_raw.mean()), "rollout_corr/weight_max": float(units_raw.max()),
            "rollout_corr/weight_min": float(units_raw.min()),
            "rollout_corr/ess": float(units_w.sum()) ** 2 / (units_w.numel() * square_sum) if square_sum > 0 else 0.0,
            "rollout_corr/corrected_frac": float(units_corrected.mean())})
    return weights.detach(), metrics


@torch.no_grad()
def rollout_rejection_mask(log_ratio_B_T: Tensor, mask_B_T: Tensor, level: str, lower: float,
                           upper: float) -> tuple[Tensor, dict[str, float]]:
    """The mask [B, T] (dtype of `mask_B_T`) with rejected tokens set to 0.

    level "token": a token is rejected when exp(log_ratio_t) is outside [lower, upper]; "sequence": the whole
    trajectory when exp(sum_t m*log_ratio) is; "geometric": when exp(mean_t log_ratio) (the per-token geometric
    mean) is. log_ratio = old_logp - rollout_logp. Keep the loss normalisation at the counts before rejection
    ("Policy 与 Value Update", §13): rejection changes the objective's scale, not its micro-batch invariance.
    Metrics: rollout_corr/rejected_frac (share of policy tokens rejected), rollout_corr/rejected_seq_frac
    (share of non-empty trajectories with at least one rejected token).
    """
    if level not in REJECTION_LEVELS:
        raise ValueError(f"rejection level {level!r} is unknown; choose one of {', '.join(REJECTION_LEVELS)}")
    if not 0 < lower < upper:
        raise ValueError(f"rejection needs 0 < lower < upper, got lower={lower}, upper={upper}")
    keep = mask_B_T.bool()
    dtype = torch.promote_types(log_ratio_B_T.dtype, torch.float32)
    log_ratio = torch.where(keep, log_ratio_B_T.to(dtype), torch.zeros((), dtype=dtype, device=keep.device))
    if level == "token":
        stat = log_ratio
    else:
        total_B = masked_sum(log_ratio, keep, dim=-1)
        if level == "geometric":
            total_B = total_B / keep.sum(-1).clamp_min(1)
        stat = total_B[:, None].expand_as(log_ratio)
    ratio = torch.exp(stat.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    kept = keep & (ratio >= lower) & (ratio <= upper)
    rejected = keep & ~kept
    rows = keep.any(-1)
    metrics = {
        "rollout_corr/rejected_frac": float(rejected.sum()) / max(int(keep.sum()), 1),
        "rollout_corr/rejected_seq_frac": float(rejected.any(-1)[rows].sum()) / max(int(rows.sum()), 1),
    }
    return kept.to(mask_B_T.dtype), metrics


__all__ = ["IS_LEVELS", "IS_MODES", "REJECTION_LEVELS", "rollout_is_weights", "rollout_rejection_mask"]
