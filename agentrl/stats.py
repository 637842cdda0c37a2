"""Statistics and CPU accounting the benchmarks share (`agentrl bench ...`, the sandbox's included).

Leaf module: the standard library only, so the sandbox service may import it as it imports `agentrl.retry`.
"""

from __future__ import annotations

import os
from pathlib import Path


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank `q` quantile (0 <= q <= 1) of `values`: an observed value, never an interpolation."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def process_cpu_s(pid: int | None, *, children: bool = False) -> float | None:
    """User + system CPU seconds of process `pid` from Linux /proc; with `children`, plus those of its children
    it has reaped. None where unavailable (no such process, not Linux, `pid` None)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = fields[11:15] if children else fields[11:13]  # utime stime [cutime cstime]
        return sum(int(x) for x in ticks) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, TypeError):
        return None
