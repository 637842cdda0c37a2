"""Advantage estimators, token-level rewards and DAPO's overlong shaping.

Every estimator of `ADV_ESTIMATORS` has one calling convention, `estimator(AdvantageInputs) -> (advantages_B_T,
returns_B_T or None)`, so the trainer loop calls whichever `algorithm.adv_estimator` names without branching.
A user's own estimator is a `package.module:function` with that signature (`resolve_adv_estimator`).
Formulas: verl's `core_algos.py`; "Policy 与 Value Update", §8 and §14.1, and
"AI 八股: 大模型基础知识", §6.3 (GAE).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from agentrl.trainer.algos.core import (
    _group_index,
    broadcast_advantages,
    grpo_advantages,
    masked_whiten,
    resolve_named,
)


@dataclass(frozen=True)
class AdvantageInputs:
    """What an estimator may read. Shapes: B trajectories, T response tokens (padded).

    token_rewards_B_T: [B, T] rewards on policy tokens (the outcome score on the last one, see
    `token_level_rewards`, plus an environment's per-turn rewards on each turn's last one, see
    `turn_level_rewards`, minus the reward-side KL when it is on). GAE and REINFORCE++ read them token by token;
    the group estimators (GRPO, Dr.GRPO, RLOO, REINFORCE++-baseline) read `scores_B`, their sum per trajectory.
    mask_B_T: [B, T] 1 on policy tokens.
    group_ids: B ids, one per trajectory (the n samples of a prompt share one). values_B_T: [B, T] critic values
    before the update (GAE only). gamma, lam: discount and GAE lambda. norm_adv_by_std_in_grpo: False gives
    Dr.GRPO. episode_ids: None, or B ids where trajectories that share one are the parts of one episode (an agent
    program split where it edited its history): the group estimators then count the episode once, at the mean
    of its parts' scores (each part carries the outcome), and give every part the episode's advantage.
    """

    token_rewards_B_T: Tensor
    mask_B_T: Tensor
    group_ids: Sequence | Tensor
    values_B_T: Tensor | None = None
    gamma: float = 1.0
    lam: float = 1.0
    norm_adv_by_std_in_grpo: bool = True
    episode_ids: Sequence | None = None

    @property
    def scores_B(self) -> Tensor:
        """[B] total reward of each trajectory: the sum of its token rewards on policy tokens."""
        rewards = self.token_rewards_B_T.float() if not self.token_rewards_B_T.is_floating_point() else \
            self.token_rewards_B_T
        return torch.where(self.mask_B_T.bool(), rewards, torch.zeros_like(rewards)).sum(-1)


AdvantageEstimator = Callable[[AdvantageInputs], tuple[Tensor, Tensor | None]]


# ------------------------------------------------------------------------------------------- token-level rewards


def token_level_rewards(scores_B: Tensor, mask_B_T: Tensor) -> Tensor:
    """[B] outcome scores -> [B, T] token rewards: each score on its trajectory's last policy token (mask 1),
    0 everywhere else. A row without any policy token gets no reward (nothing could be trained on it)."""
    if scores_B.dim() != 1 or mask_B_T.dim() != 2 or scores_B.shape[0] != mask_B_T.shape[0]:
        raise ValueError(f"token_level_rewards wants scores [B] and mask [B, T], got {tuple(scores_B.shape)} and "
                         f"{tuple(mask_B_T.shape)}")
    scores = scores_B if scores_B.is_floating_point() else scores_B.float()
    keep = mask_B_T.bool()
    positions = torch.arange(mask_B_T.shape[1], device=mask_B_T.device).expand_as(keep)
    last_T = torch.where(keep, positions, torch.full_like(positions, -1)).max(-1).values  # -1: empty row
    out = torch.zeros(mask_B_T.shape, dtype=scores.dtype, device=scores.device)
    rows = torch.nonzero(last_T >= 0).flatten()
    out[rows, last_T[rows]] = scores[rows]
    return out


def turn_level_rewards(turn_rewards: Sequence[float], turn_ids_T: Sequence[int],
                       mask_T: Sequence[int]) -> list[float]:
    """One episode's per-turn rewards -> one reward per response token [T]: turn i's reward on the last policy
    token (mask 1) whose turn id is i, 0 everywhere else (`Episode.turn_rewards`, `Episode.turn_ids`).

    The outcome part of the episode's reward goes on its last policy token separately (`token_level_rewards`), so
    for an episode whose last turn has a reward both land on that token and add up. Raises ValueError for a
    rewarded turn without a policy token, or lists of different lengths."""
    if len(turn_ids_T) != len(mask_T):
        raise ValueError(f"turn_level_rewards wants turn ids and mask of one length, got {len(turn_ids_T)} and "
                         f"{len(mask_T)}")
    last: dict[int, int] = {}
    for t, (turn, m) in enumerate(zip(turn_ids_T, mask_T)):
        if m:
            last[turn] = t
    out = [0.0] * len(mask_T)
    for turn, reward in enumerate(turn_rewards):
        if turn not in last:
            raise ValueError(f"turn {turn} has a reward ({reward}) but no policy token")
        out[last[turn]] += float(reward)
    return out


def overlong_penalty(lengths_B: Tensor | Sequence[int], max_len: int, buffer_len: int,
                     penalty_factor: float) -> Tensor:
    """DAPO soft overlong punishment, [B] (reward units), to be added to the outcome score.

    penalty = min(0, (max_len - buffer_len - L) / buffer_len) * penalty_factor: 0 up to max_len - buffer_len,
    falling linearly to -penalty_factor at L = max_len ("AI 八股: 大模型基础知识", §9.4; verl `dapo` reward
    manager).
    L counts the response tokens the length budget counts (agentrl: everything after the prompt).
    """
    if buffer_len < 1 or buffer_len > max_len:
        raise ValueError(f"overlong buffer_len must be in [1, max_len={max_len}], got {buffer_len}")
    if penalty_factor < 0:
        raise ValueError(f"overlong penalty_factor must be >= 0, got {penalty_factor}")
    lengths = torch.as_tensor(lengths_B, dtype=torch.float32)
    return ((max_len - buffer_len - lengths) / buffer_len).clamp(max=0.0) * penalty_factor


# ----------------------------------------------------------------------------------------------------- estimators


@torch.no_grad()
def gae_advantages(token_rewards_B_T: Tensor, values_B_T: Tensor, mask_B_T: Tensor, gamma: float,
                   lam: float) -> tuple[Tensor, Tensor]:
    """Generalized advantage estimation over policy tokens only, then whitened.

    token_rewards_B_T, values_B_T: [B, T] (reward units); mask_B_T: [B, T] 1 on policy tokens. Walking t from
    the end: delta = r_t + gamma * V_next - V_t; g = delta + gamma * lam * A_next; where mask_t = 1, V_next = V_t
    and A_next = g; where mask_t = 0 (tool observations, template glue, padding) both carry over unchanged, so an
    observation span is skipped rather than treated as a step or as the end of the episode (verl's multi-turn
    GAE; the `compute_gae` of "AI 八股: 大模型基础知识", §7.6, stops at the first mask-0 token, which is the same
    for right padding).
    Rewards on mask-0 tokens are ignored.
    Returns (advantages_B_T, returns_B_T): returns = A + V from the un-whitened A, the critic's target; the
    advantages are whitened over the mask, (A - mean) / sqrt(var + 1e-8) with the unbiased variance (verl's
    masked_whiten; the teaching version of "AI 八股: 大模型基础知识", §7.6,
    divides by N). Both are 0 where the mask is 0.
    """
    if token_rewards_B_T.shape != values_B_T.shape or token_rewards_B_T.shape != mask_B_T.shape:
        raise ValueError(f"gae_advantages wants rewards, values and mask of one [B, T] shape, got "
                         f"{tuple(token_rewards_B_T.shape)}, {tuple(values_B_T.shape)}, {tuple(mask_B_T.shape)}")
    dtype = torch.promote_types(torch.promote_types(token_rewards_B_T.dtype, values_B_T.dtype), torch.float32)
    rewards, values, keep = token_rewards_B_T.to(dtype), values_B_T.to(dtype), mask_B_T.bool()
    next_value = torch.zeros(values.shape[0], dtype=dtype, device=values.device)
    next_adv = torch.zeros_like(next_value)
    adv = torch.zeros_like(values)
    for t in reversed(range(values.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        g = delta + gamma * lam * next_adv
        next_value = torch.where(keep[:, t], values[:, t], next_value)
        next_adv = torch.where(keep[:, t], g, next_adv)
        adv[:, t] = next_adv
    zero = torch.zeros((), dtype=dtype, device=values.device)
    returns = torch.where(keep, adv + values, zero)
    return masked_whiten(adv, keep), returns


@torch.no_grad()
def rloo_advantages(scores_B: Tensor, group_ids: Sequence | Tensor) -> Tensor:
    """REINFORCE leave-one-out, one scalar per trajectory, [B].

    In a group of n > 1: A_i = s_i * n/(n-1) - mean_g * n/(n-1), i.e. s_i minus the mean of the other n-1
    scores. A singleton keeps its raw score (as verl; GRPO gives a singleton 0). Broadcast with
    `broadcast_advantages`.
    """
    scores = scores_B if scores_B.is_floating_point() else scores_B.float()
    index = _group_index(group_ids, scores.shape[0], scores.device)
    num_groups = int(index.max()) + 1 if index.numel() else 0
    zeros = torch.zeros(num_groups, dtype=scores.dtype, device=scores.device)
    counts = zeros.index_add(0, index, torch.ones_like(scores))[index]
    means = (zeros.index_add(0, index, scores) / zeros.index_add(0, index, torch.ones_like(scores)))[index]
    scale = counts / (counts - 1).clamp_min(1)
    return torch.where(counts > 1, scores * scale - means * scale, scores)


@torch.no_grad()
def reinforce_pp_advantages(token_rewards_B_T: Tensor, mask_B_T: Tensor, gamma: float) -> tuple[Tensor, Tensor]:
    """REINFORCE++: discounted returns over policy tokens, whitened over the batch.

    Walking t from the end, on mask-1 tokens: G = r_t + gamma * G, returns_t = G; on mask-0 tokens G carries
    over unchanged (an observation span is neither a step nor an end). verl resets G to 0 at every mask-0 token,
    which cuts a multi-turn episode's later rewards off from its earlier turns; agentrl carries it.
    Returns (masked_whiten(returns) * mask, returns * mask), both [B, T].
    """
    dtype = torch.promote_types(token_rewards_B_T.dtype, torch.float32)
    rewards, keep = token_rewards_B_T.to(dtype), mask_B_T.bool()
    running = torch.zeros(rewards.shape[0], dtype=dtype, device=rewards.device)
    returns = torch.zeros_like(rewards)
    for t in reversed(range(rewards.shape[1])):
        running = torch.where(keep[:, t], rewards[:, t] + gamma * running, running)
        returns[:, t] = torch.where(keep[:, t], running, torch.zeros_like(running))
    return masked_whiten(returns, keep), returns


@torch.no_grad()
def reinforce_pp_baseline_advantages(scores_B: Tensor, group_ids: Sequence | Tensor, mask_B_T: Tensor,
                                     episode_ids: Sequence | None = None) -> Tensor:
    """REINFORCE++-baseline, [B, T]: s_i - mean of its group (a singleton's mean is 0, so it keeps its score),
    broadcast over the policy tokens, then whitened over the whole batch's mask (`episode_ids`: see
    `AdvantageInputs`)."""
    scores = scores_B if scores_B.is_floating_point() else scores_B.float()
    centered = once_per_episode(_group_centered, scores, group_ids, episode_ids)
    return masked_whiten(broadcast_advantages(centered, mask_B_T), mask_B_T)


def _group_centered(scores: Tensor, group_ids: Sequence | Tensor) -> Tensor:
    index = _group_index(group_ids, scores.shape[0], scores.device)
    num_groups = int(index.max()) + 1 if index.numel() else 0
    zeros = torch.zeros(num_groups, dtype=scores.dtype, device=scores.device)
    counts = zeros.index_add(0, index, torch.ones_like(scores))
    means = (zeros.index_add(0, index, scores) / counts)[index]
    return torch.where(counts[index] > 1, scores - means, scores)


# ------------------------------------------------------------------------------------- the estimator registry


def _gae(x: AdvantageInputs) -> tuple[Tensor, Tensor | None]:
    if x.values_B_T is None:
        raise ValueError("the gae estimator needs critic values (AdvantageInputs.values_B_T); enable the critic")
    return gae_advantages(x.token_rewards_B_T, x.values_B_T, x.mask_B_T, x.gamma, x.lam)


def once_per_episode(group_fn: Callable[[Tensor, Sequence | Tensor], Tensor], scores_B: Tensor,
                     group_ids: Sequence | Tensor, episode_ids: Sequence | None) -> Tensor:
    """`group_fn(scores, group_ids) -> [n]` with each episode one member of its group: the parts of a split
    episode (equal `episode_ids`) count once, at the mean of their scores, and share the episode's result."""
    if episode_ids is None:
        return group_fn(scores_B, group_ids)
    index = _group_index(episode_ids, scores_B.shape[0], scores_B.device)  # [B] -> episode 0..E-1
    num = int(index.max()) + 1 if index.numel() else 0
    zeros = torch.zeros(num, dtype=scores_B.dtype, device=scores_B.device)
    scores_E = zeros.index_add(0, index, scores_B) / zeros.index_add(0, index, torch.ones_like(scores_B))
    first = torch.full((num,), scores_B.shape[0], dtype=torch.long).scatter_reduce(
        0, index.cpu(), torch.arange(scores_B.shape[0]), reduce="amin")  # each episode's first part
    groups_E = group_ids[first.to(group_ids.device)] if isinstance(group_ids, Tensor) else \
        [group_ids[i] for i in first.tolist()]
    return group_fn(scores_E, groups_E)[index]


def _grpo(x: AdvantageInputs) -> tuple[Tensor, Tensor | None]:
    adv_B = once_per_episode(lambda s, g: grpo_advantages(s, g, norm_by_std=x.norm_adv_by_std_in_grpo),
                             x.scores_B, x.group_ids, x.episode_ids)
    return broadcast_advantages(adv_B, x.mask_B_T), None


def _rloo(x: AdvantageInputs) -> tuple[Tensor, Tensor | None]:
    adv_B = once_per_episode(rloo_advantages, x.scores_B, x.group_ids, x.episode_ids)
    return broadcast_advantages(adv_B, x.mask_B_T), None


def _reinforce_pp(x: AdvantageInputs) -> tuple[Tensor, Tensor | None]:
    return reinforce_pp_advantages(x.token_rewards_B_T, x.mask_B_T, x.gamma)


def _reinforce_pp_baseline(x: AdvantageInputs) -> tuple[Tensor, Tensor | None]:
    return reinforce_pp_baseline_advantages(x.scores_B, x.group_ids, x.mask_B_T, x.episode_ids), None


ADV_ESTIMATORS: dict[str, AdvantageEstimator] = {
    "gae": _gae,
    "grpo": _grpo,  # norm_adv_by_std_in_grpo=False: Dr.GRPO
    "rloo": _rloo,
    "reinforce_plus_plus": _reinforce_pp,
    "reinforce_plus_plus_baseline": _reinforce_pp_baseline,
}
NEEDS_CRITIC = ("gae",)  # estimators that read values_B_T


def check_adv_estimator(fn, what: str) -> None:
    """Raise ValueError unless `fn` can be called as fn(inputs)."""
    if not callable(fn):
        raise ValueError(f"{what} is not callable")
    try:
        inspect.signature(fn).bind(None)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{what} must accept one argument (an AdvantageInputs) and return "
                         f"(advantages_B_T, returns_B_T or None): {e}") from None


def resolve_adv_estimator(name: str) -> AdvantageEstimator:
    """A name of `ADV_ESTIMATORS` or a `package.module:function` escape hatch (signature checked)."""
    return resolve_named(ADV_ESTIMATORS, name, "algorithm.adv_estimator", check_adv_estimator, "an AdvantageInputs")


__all__ = [
    "ADV_ESTIMATORS",
    "NEEDS_CRITIC",
    "AdvantageEstimator",
    "AdvantageInputs",
    "check_adv_estimator",
    "gae_advantages",
    "once_per_episode",
    "overlong_penalty",
    "reinforce_pp_advantages",
    "reinforce_pp_baseline_advantages",
    "resolve_adv_estimator",
    "rloo_advantages",
    "token_level_rewards",
    "turn_level_rewards",
]
