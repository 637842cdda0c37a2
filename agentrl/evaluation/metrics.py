"""Evaluation statistics over finished episodes: pass@k, mean@n, turns, tool use, errors, per data source.

Pure functions over `Episode` lists; no engines or services here, so they are trivially testable.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import Iterable

from agentrl.types import Episode


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimator (Chen et al. 2021): 1 - C(n-c, k) / C(n, k).

    n samples of one task of which c are correct; k <= n. Computed as a product to stay exact for large n.
    """
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: need 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    prob_all_wrong = 1.0
    for i in range(n - c + 1, n + 1):
        prob_all_wrong *= 1.0 - k / i
    return 1.0 - prob_all_wrong


def _group_by_task(episodes: Iterable[Episode]) -> dict[str, list[Episode]]:
    groups: dict[str, list[Episode]] = defaultdict(list)
    for ep in episodes:
        groups[ep.task_id or ep.uid].append(ep)
    return groups


def summarize(episodes: list[Episode], *, ks: Iterable[int] = (1,), success_threshold: float = 1.0) -> dict:
    """Aggregate statistics of one evaluation run.

    An episode is a success when its reward >= `success_threshold`. Infra-failed episodes are excluded from
    success statistics (they say nothing about the policy) and counted separately; a task whose every sample
    failed for infra reasons is counted in `tasks_without_valid_samples`.
    Returns a JSON-serialisable dict; `by_data_source` holds the same statistics per data source.
    """
    result = _summarize_one(episodes, ks=ks, success_threshold=success_threshold)
    sources = sorted({ep.data_source for ep in episodes})
    if len(sources) > 1:
        result["by_data_source"] = {
            src: _summarize_one([e for e in episodes if e.data_source == src], ks=ks,
                                success_threshold=success_threshold)
            for src in sources
        }
    return result


def _summarize_one(episodes: list[Episode], *, ks: Iterable[int], success_threshold: float) -> dict:
    valid = [e for e in episodes if not e.infra_error]
    groups = _group_by_task(valid)
    n_tasks_all = len(_group_by_task(episodes))
    out: dict = {
        "num_tasks": n_tasks_all,
        "num_episodes": len(episodes),
        "infra_failed_episodes": len(episodes) - len(valid),
        "tasks_without_valid_samples": n_tasks_all - len(groups),
    }
    if not valid:
        return out
    out["mean_reward"] = sum(e.reward for e in valid) / len(valid)
    out["mean@n"] = sum(e.reward >= success_threshold for e in valid) / len(valid)
    for k in ks:
        scores = [pass_at_k(len(g), sum(e.reward >= success_threshold for e in g), k)
                  for g in groups.values() if len(g) >= k]
        if scores:
            out[f"pass@{k}"] = sum(scores) / len(scores)
    out["avg_turns"] = sum(e.num_turns for e in valid) / len(valid)
    calls = [c for e in valid for c in e.tool_calls]
    out["tool_calls_per_episode"] = len(calls) / len(valid)
    errors = Counter(c.get("error_kind") for c in calls if not c.get("ok", True))
    out["tool_error_rate"] = (sum(errors.values()) / len(calls)) if calls else 0.0
    out["tool_errors_by_kind"] = dict(sorted((str(k), v) for k, v in errors.items()))
    out["finish_reasons"] = dict(sorted(Counter(e.finish_reason for e in episodes).items()))
    model_tokens = [sum(e.response_mask) for e in valid]
    out["avg_model_tokens"] = sum(model_tokens) / len(valid)
    out["avg_response_tokens"] = sum(len(e.response_ids) for e in valid) / len(valid)
    return out


def stderr_of_mean(p: float, n: int) -> float:
    """Binomial standard error of a success rate p measured on n independent tasks."""
    return math.sqrt(max(p * (1 - p), 0.0) / n) if n else float("nan")
