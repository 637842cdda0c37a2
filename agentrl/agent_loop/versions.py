"""Weight versions of sampled tokens: which weights sampled each token of a model turn.

Engines report a version per token (`Generation.weight_versions`, e.g. when new weights arrived in the middle of
a turn) or one per turn (`Generation.metrics["weight_version"]`). The agent loop keeps one per response token in
`Episode.response_versions`; the trainer's staleness accounting (`agentrl.trainer.staleness`) reads them.
"""

from __future__ import annotations

from agentrl.inference.wire import version_from_label as as_version
from agentrl.types import Generation


def sampled_versions(gen: Generation) -> list[int] | None:
    """The weight version that sampled each token of `gen`: the engine's per-token list, else the turn's
    `metrics["weight_version"]` for every token; None when the engine reports neither."""
    if gen.weight_versions:
        return [int(v) for v in gen.weight_versions]
    version = as_version(gen.metrics.get("weight_version"))
    return None if version is None else [version] * len(gen.token_ids)


__all__ = ["as_version", "sampled_versions"]
