"""Reward-side reference KL: the controllers of its coefficient beta and the shaped token rewards
("Policy 与 Value Update", §7.1; the adaptive controller of Ziegler et al.)."""

from __future__ import annotations

import torch
from torch import Tensor

from agentrl.trainer.algos.core import kl_penalty, masked_sum

ADAPTIVE_KL_ERROR_CLIP = 0.2  # |proportional error| bound of the adaptive controller (Ziegler et al.)


class FixedKLController:
    """beta stays `kl_coef`; `update` does nothing."""

    def __init__(self, kl_coef: float):
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        del current_kl, n_steps

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])


class AdaptiveKLController(FixedKLController):
    """beta steered towards a target KL per token (Ziegler et al. 2019):

        err = clip(current_kl / target_kl - 1, -0.2, 0.2);   beta *= 1 + err * n_steps / horizon

    called once per RL step with the batch's mean KL (`actor/reward_kl_penalty`) and n_steps = its number of
    trajectories (verl passes the batch size as n_steps). `value` is the current beta.
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int):
        super().__init__(init_kl_coef)
        self.target, self.horizon = float(target_kl), float(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        err = min(max(float(current_kl) / self.target - 1, -ADAPTIVE_KL_ERROR_CLIP), ADAPTIVE_KL_ERROR_CLIP)
        self.value *= 1 + err * n_steps / self.horizon


def make_kl_controller(type: str, kl_coef: float, target_kl: float = 0.1,
                       horizon: int = 10000) -> FixedKLController:
    """`algorithm.kl_ctrl` -> a controller ("fixed" or "adaptive")."""
    if type == "fixed":
        return FixedKLController(kl_coef)
    if type == "adaptive":
        return AdaptiveKLController(kl_coef, target_kl, horizon)
    raise ValueError(f"unknown KL controller type {type!r}; choose 'fixed' or 'adaptive'")


@torch.no_grad()
def apply_kl_in_reward(token_scores_B_T: Tensor, old_logprobs_B_T: Tensor, ref_logprobs_B_T: Tensor,
                       mask_B_T: Tensor, kl_coef: float, kind: str = "kl") -> tuple[Tensor, dict[str, float]]:
    """Token rewards = token scores - beta * kl_penalty(old_logp, ref_logp, kind) on policy tokens, [B, T].

    token_scores_B_T: [B, T] (e.g. `token_level_rewards`); old/ref log-probs [B, T] (nats) of pi_old and the
    frozen reference; mask_B_T: [B, T]; kl_coef: beta (the controller's `value`). Mask-0 tokens come back 0.
    Metrics (floats): actor/reward_kl_penalty, the KL as the controller reads it (mean over the policy tokens
    of each trajectory, then over trajectories with at least one, "Policy 与 Value Update", §7.1), and
    actor/reward_kl_penalty_coeff = beta.
    """
    keep = mask_B_T.bool()
    kl = kl_penalty(old_logprobs_B_T, ref_logprobs_B_T, kind)
    zero = torch.zeros((), dtype=kl.dtype, device=kl.device)
    rewards = torch.where(keep, token_scores_B_T.to(kl.dtype) - kl_coef * kl, zero)
    lengths_B = keep.sum(-1)
    rows = lengths_B > 0
    per_seq = masked_sum(kl, keep, dim=-1)[rows] / lengths_B[rows]
    current = float(per_seq.mean()) if per_seq.numel() else 0.0
    return rewards, {"actor/reward_kl_penalty": current, "actor/reward_kl_penalty_coeff": float(kl_coef)}


__all__ = ["AdaptiveKLController", "FixedKLController", "apply_kl_in_reward", "make_kl_controller"]
