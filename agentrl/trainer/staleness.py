"""Staleness: how many weight updates behind the trainer the tokens of a trajectory were sampled.

Every policy token records the weight version that sampled it (`Episode.response_versions`, -1 where the mask
is 0). A trajectory's staleness is the trainer's version minus the version of its OLDEST policy token: the
number of updates the trainer made since the first of its tokens was sampled. A group is as stale as its
stalest trajectory; `filter_stale_groups` drops whole groups (their advantages are computed together) that are
more than `max_staleness` versions behind.

In sync mode the engine samples a step's episodes with the trainer's current weights, so every staleness is 0.

Pure functions over episodes and version lists; no engines, no config objects.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from agentrl.types import Episode


def staleness(versions: Sequence[int], mask: Sequence[int], trainer_version: int) -> int | None:
    """`trainer_version` minus the oldest version among the policy tokens (mask 1) of one trajectory.

    `versions` and `mask` are aligned with the response tokens. None when the trajectory has no policy token, or
    no versions (`versions` empty: the engine did not report them). A policy token without a version (< 0), or
    one sampled by weights newer than the trainer's, is a bookkeeping bug and raises ValueError.
    """
    if not versions or not any(mask):
        return None
    if len(versions) != len(mask):
        raise ValueError(f"{len(versions)} weight versions for {len(mask)} mask entries")
    policy = [v for v, m in zip(versions, mask) if m]
    if min(policy) < 0:
        at = next(i for i, (v, m) in enumerate(zip(versions, mask)) if m and v < 0)
        raise ValueError(f"policy token {at} has no weight version ({versions[at]}); every token with mask 1 needs "
                         "the version that sampled it")
    if max(policy) > trainer_version:
        raise ValueError(f"a policy token was sampled by weight version {max(policy)}, newer than the trainer's "
                         f"version {trainer_version}: the trainer's version is not the one it pushed to the engine")
    return trainer_version - min(policy)


def spans_update(versions: Sequence[int], mask: Sequence[int]) -> bool:
    """Whether the policy tokens of one trajectory were sampled by more than one weight version (new weights
    arrived while it was in flight)."""
    return len({v for v, m in zip(versions, mask) if m}) > 1


def episode_staleness(episode: Episode, trainer_version: int) -> int | None:
    """`staleness` of one episode's policy tokens."""
    return staleness(episode.response_versions, episode.response_mask, trainer_version)


def filter_stale_groups(groups: list[list[Episode]], max_staleness: int,
                        trainer_version: int) -> tuple[list[list[Episode]], int]:
    """(the groups whose every trajectory is at most `max_staleness` versions behind `trainer_version`, how many
    groups were dropped), in order. A group without policy tokens is kept (nothing in it is stale). An episode
    with policy tokens but no recorded versions raises ValueError: its staleness cannot be bounded."""
    if max_staleness < 0:
        raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
    kept: list[list[Episode]] = []
    dropped = 0
    for group in groups:
        worst = -1
        for ep in group:
            lag = episode_staleness(ep, trainer_version)
            if lag is None and any(ep.response_mask):
                raise ValueError(f"episode {ep.episode_id or ep.uid} has no weight versions: its engine did not "
                                 "report them, so its staleness cannot be bounded; use an engine that reports "
                                 "weight versions (LocalEngine, `agentrl engine serve`, SGLang)")
            worst = max(worst, -1 if lag is None else lag)
        if worst > max_staleness:
            dropped += 1
        else:
            kept.append(group)
    return kept, dropped


def staleness_metrics(episodes: list[Episode], trainer_version: int | None) -> dict[str, float]:
    """One step's staleness metrics over `episodes` (those with policy tokens):
    `rollout/episodes_spanning_update` (policy tokens from more than one version); with `trainer_version` (None
    when the engine cannot say which weights it serves): `rollout/staleness_mean`, `rollout/staleness_max`,
    `rollout/staleness_hist/K` (episodes K versions behind, for K = 0 .. max) and
    `rollout/unversioned_episodes` (policy tokens without versions, left out of the others)."""
    sampled = [ep for ep in episodes if any(ep.response_mask)]
    out = {"rollout/episodes_spanning_update": float(sum(spans_update(ep.response_versions, ep.response_mask)
                                                         for ep in sampled))}
    if trainer_version is None:
        return out
    lags = [episode_staleness(ep, trainer_version) for ep in sampled]
    known = [lag for lag in lags if lag is not None]
    out["rollout/unversioned_episodes"] = float(len(lags) - len(known))
    if not known:
        return out
    counts = Counter(known)
    out["rollout/staleness_mean"] = sum(known) / len(known)
    out["rollout/staleness_max"] = float(max(known))
    for k in range(max(known) + 1):
        out[f"rollout/staleness_hist/{k}"] = float(counts[k])
    return out


__all__ = ["episode_staleness", "filter_stale_groups", "spans_update", "staleness", "staleness_metrics"]
