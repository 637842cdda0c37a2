"""The records every policy loss shares: what it reads (`PolicyLossInputs`), the knobs a run configures
(`PolicyLossKnobs`) and what it returns (`LossOutputs`).

Every policy loss has one signature, `loss(inputs: PolicyLossInputs, options) -> LossOutputs`: the built-in
modes take their own small options record (`VanillaOptions`, ... in `losses`), a user's `module:function`
loss takes `PolicyLossKnobs` itself. Shape suffixes: B trajectories, T response tokens (padded).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from torch import Tensor

from agentrl.trainer.algos.core import agg_loss


@dataclass(frozen=True)
class PolicyLossInputs:
    """One micro-batch as a policy loss sees it.

    logprobs_B_T: [B, T] log p of the sampled tokens under the policy being trained (nats, differentiable).
    old_logprobs_B_T: [B, T] the same under pi_old, the policy the ratio is anchored to (no gradient).
    advantages_B_T: [B, T], or [B] (one value per trajectory); a [B] tensor is kept as [B, 1], which broadcasts
    over T. mask_B_T: [B, T] 1 on the tokens that count (policy tokens).
    rollout_logprobs_B_T: [B, T] the engine's log p at sampling (pi_rollout) when known, else None; no built-in
    loss reads it (the rollout correction arrives as is_weights_B_T).
    is_weights_B_T: [B, T] rollout-correction weights (detached) that multiply the token losses, or None (1).
    agg_mode, num_tokens, num_seqs, scale_factor: how `agg` reduces a token loss, as `agg_loss`: num_tokens and
    num_seqs are the GLOBAL counts of the mini-batch (loss tokens, trajectories), so the micro-batch losses sum
    to the mini-batch objective whatever the split; None means this call's own counts.
    """

    logprobs_B_T: Tensor
    old_logprobs_B_T: Tensor
    advantages_B_T: Tensor
    mask_B_T: Tensor
    rollout_logprobs_B_T: Tensor | None = None
    is_weights_B_T: Tensor | None = None
    agg_mode: str = "token-mean"
    num_tokens: int | Tensor | None = None
    num_seqs: int | Tensor | None = None
    scale_factor: float | None = None

    def __post_init__(self) -> None:
        adv, like = self.advantages_B_T, self.logprobs_B_T
        adv_b_t = adv[:, None] if adv.dim() == 1 else adv
        if adv_b_t.dim() != 2 or adv_b_t.shape[0] != like.shape[0] or adv_b_t.shape[1] not in (1, like.shape[1]):
            raise ValueError(f"advantages must be [B] or [B, T], got {tuple(adv.shape)} for logprobs of shape "
                             f"{tuple(like.shape)}")
        object.__setattr__(self, "advantages_B_T", adv_b_t)

    def agg(self, loss_B_T: Tensor) -> Tensor:
        """`agg_loss` of a [B, T] token loss over `mask_B_T` with this micro-batch's mode and global counts."""
        return agg_loss(loss_B_T, self.mask_B_T, self.agg_mode, num_tokens=self.num_tokens, num_seqs=self.num_seqs,
                        scale_factor=self.scale_factor)

    def weighted(self, loss_B_T: Tensor) -> Tensor:
        """The token loss times the (detached) rollout-correction weights, when there are any."""
        return loss_B_T if self.is_weights_B_T is None else loss_B_T * self.is_weights_B_T.detach()


class LossOutputs(NamedTuple):
    """A policy loss's result: `loss` (0-dim, to minimise, differentiable) and `metrics` (detached 0-dim tensors
    over the call's masked tokens; every built-in loss reports pg_clipfrac, ppo_kl and pg_clipfrac_lower)."""

    loss: Tensor
    metrics: dict[str, Tensor]


@dataclass(frozen=True)
class PolicyLossKnobs:
    """Every policy-loss knob a run configures (`actor.clip_ratio_*`, `actor.policy_loss.*`); each built-in
    mode builds its own options record from it, a `module:function` loss receives it whole."""

    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float = 3.0
    clip_cov_ratio: float = 0.0002
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 0.0002
    ppo_kl_coef: float = 0.1


__all__ = ["LossOutputs", "PolicyLossInputs", "PolicyLossKnobs"]
