"""The actor's total loss for one micro-batch: the configured policy loss plus the reference-KL and entropy terms."""

from __future__ import annotations

from torch import Tensor

from agentrl.trainer.algos.core import kl_penalty, masked_sum
from agentrl.trainer.algos.loss_records import LossOutputs, PolicyLossInputs, PolicyLossKnobs
from agentrl.trainer.algos.losses import resolve_policy_loss


def ppo_objective(
    x: PolicyLossInputs, loss_mode: str = "vanilla", knobs: PolicyLossKnobs | None = None, *,
    ref_logprobs_B_T: Tensor | None = None, kl_loss_coef: float = 0.0, kl_loss_type: str = "low_var_kl",
    entropy_B_T: Tensor | None = None, entropy_coeff: float = 0.0,
) -> LossOutputs:  # fmt: skip
    """The actor's loss for one micro-batch ("Policy 与 Value Update", §5), to minimise:

        loss = pg(loss_mode) + kl_loss_coef * agg(kl_penalty(logp, ref, kl_loss_type)) - entropy_coeff * agg(H)

    every term reduced by `x.agg` (the mode and GLOBAL counts of the mini-batch), so summing the micro-batch
    losses gives the mini-batch objective. `loss_mode`: a `POLICY_LOSSES` name or `module:function`, called as
    fn(x, options) with the options it builds from `knobs` (None: the defaults of `PolicyLossKnobs`). The
    rollout-correction weights `x.is_weights_B_T` multiply only the policy-gradient token losses, not ppo_kl,
    the KL or the entropy term.
    ref_logprobs_B_T / entropy_B_T: [B, T]; the KL term is on when `ref_logprobs_B_T` is given, the entropy term
    when `entropy_B_T` is given (entropy_coeff 0 still reports it).
    Metrics (detached 0-dim tensors): pg_loss and the policy loss's own (pg_clipfrac, ppo_kl, pg_clipfrac_lower);
    with the KL kl_loss and kl (mean per policy token); with entropy entropy_loss and entropy (mean per token).
    """
    policy_loss = resolve_policy_loss(loss_mode)
    pg_loss, pg_stats = policy_loss.fn(x, policy_loss.options(knobs or PolicyLossKnobs()))
    loss = pg_loss
    stats = {"pg_loss": pg_loss.detach(), **pg_stats}
    mask = x.mask_B_T
    tokens = mask.to(x.logprobs_B_T.dtype).sum().clamp_min(1)
    if ref_logprobs_B_T is not None:
        kl = kl_penalty(x.logprobs_B_T, ref_logprobs_B_T, kl_loss_type)
        kl_loss = x.agg(kl)
        loss = loss + kl_loss_coef * kl_loss
        stats["kl_loss"] = kl_loss.detach()
        stats["kl"] = masked_sum(kl.detach(), mask) / tokens
    if entropy_B_T is not None:
        ent_loss = x.agg(entropy_B_T)
        if entropy_coeff != 0:
            loss = loss - entropy_coeff * ent_loss
        stats["entropy_loss"] = ent_loss.detach()
        stats["entropy"] = masked_sum(entropy_B_T.detach(), mask) / tokens
    return LossOutputs(loss, stats)


__all__ = ["ppo_objective"]
