"""How long to wait before retrying a request: one backoff rule for every client in agentrl.

Used by the tool clients (`tools/remote.py`, `tools/mcp.py`), the sandbox client (`sandbox/client.py`) and the
SGLang client (`inference/sglang.py`). Each client decides *whether* a failure may be retried (a request that
may have run must not run twice); this module only decides *how long* to wait.

Rule: exponential growth with equal jitter. Retry `attempt` (0 for the first retry) waits a uniform time in
`[d/2, d]` with `d = min(cap_s, base_s * 2**attempt)`, so clients that failed together spread out, yet every
wait is at least half the nominal one. A server's `Retry-After` replaces the exponential part: the wait is
uniform in `[r, 1.5 r]` (never shorter than the server asked), with `r = min(retry_after_s, cap_s)`, and never
longer than `cap_s`.
"""

from __future__ import annotations

import random


def backoff_delay(attempt: int, base_s: float, cap_s: float, *, retry_after_s: float | None = None,
                  rng: random.Random | None = None) -> float:
    """Seconds to sleep before retry number `attempt` (0-based); see the module docstring for the rule.

    `retry_after_s` is the server's Retry-After in seconds (`parse_retry_after`), None when it sent none.
    `rng` replaces the module's random generator (tests).
    """
    if attempt < 0:
        raise ValueError(f"attempt must be >= 0, got {attempt}")
    if base_s < 0 or cap_s < 0:
        raise ValueError(f"backoff base and cap must be >= 0, got base_s={base_s}, cap_s={cap_s}")
    uniform = (rng or random).uniform
    if retry_after_s is not None:
        floor = min(max(retry_after_s, 0.0), cap_s)
        return uniform(floor, min(cap_s, 1.5 * floor))
    d = min(cap_s, base_s * 2.0 ** min(attempt, 64))
    return uniform(d / 2, d)


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (the delta-seconds form, e.g. "3" or "0.5").

    None when the header is absent or in the HTTP-date form: the caller then uses its own backoff.
    """
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return max(0.0, seconds) if seconds == seconds else None  # NaN is not a delay


__all__ = ["backoff_delay", "parse_retry_after"]
