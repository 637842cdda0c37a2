"""What every command prints besides its own results: durations, progress lines with an ETA for a stream that is
not a terminal (a tqdm bar when it is), and the switches that keep third-party libraries quiet. Used by training,
SFT, evaluation and the quickstart; the training step line is `agentrl.trainer.console`.
"""

from __future__ import annotations

import math
import os
import sys
import time
from typing import TextIO


def format_duration(seconds: float) -> str:
    """`45s`, `3m05s`, `1h02m`."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class ProgressLines:
    """Plain progress lines for a stream that is not a terminal: one line each time another tenth of `total` is
    done, `desc: 40/400 episodes (10%), 12s, eta 1m48s`. Same interface as the tqdm bar (update, close)."""

    def __init__(self, total: int, desc: str, unit: str = "episodes", stream: TextIO | None = None):
        self.total, self.desc, self.unit = total, desc, unit
        self.stream = stream or sys.stderr
        self.done = 0
        self._tenths = 0
        self._start = time.monotonic()

    def update(self, count: int = 1) -> None:
        self.done += count
        tenths = math.floor(10 * self.done / self.total) if self.total else 10
        if tenths <= self._tenths:
            return
        self._tenths = tenths
        elapsed = time.monotonic() - self._start
        line = f"{self.desc}: {self.done}/{self.total} {self.unit} ({self.done / self.total:.0%}), " \
               f"{format_duration(elapsed)}"
        if self.done < self.total:
            line += f", eta {format_duration(elapsed / self.done * (self.total - self.done))}"
        print(line, file=self.stream, flush=True)

    def close(self) -> None:
        pass


def progress(total: int, desc: str, unit: str = "episodes", stream: TextIO | None = None):
    """A tqdm bar when `stream` (default stderr) is a terminal, else `ProgressLines`."""
    stream = stream or sys.stderr
    if stream.isatty():
        from tqdm import tqdm

        return tqdm(total=total, desc=desc, unit=unit[:2], leave=False, file=stream)
    return ProgressLines(total, desc, unit, stream)


def quiet_third_party() -> None:
    """Turn off what other libraries print that a person does not need: Hugging Face weight-loading bars, Ray's
    usage statistics and ANSI colours in Ray's worker prefixes when stdout is not a terminal (Ray's start-up
    notices: `agentrl.services.start_ray`).

    Environment variables are set only where the user has not set them, so e.g. `HF_HUB_DISABLE_PROGRESS_BARS=0`
    brings the bars back; they are inherited by Ray workers and child services started afterwards.
    """
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if not sys.stdout.isatty():
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")
    if os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] != "0":
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()


__all__ = ["ProgressLines", "format_duration", "progress", "quiet_third_party"]
