"""The statistics the benchmarks print: nearest-rank percentiles and per-process CPU seconds."""

from __future__ import annotations

import os
import time

from agentrl.stats import percentile, process_cpu_s


def test_percentile_is_an_observed_value_by_nearest_rank():
    values = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert [percentile(values, q) for q in (0.0, 0.5, 0.99, 1.0)] == [1.0, 3.0, 5.0, 5.0]
    assert percentile([1.0, 2.0], 0.5) == 1.0  # rank 0.5 rounds half to even; never the interpolated 1.5
    assert percentile([7.0], 0.99) == 7.0


def test_process_cpu_s_counts_this_process_and_is_none_when_unreadable():
    before = process_cpu_s(os.getpid())
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:  # burn CPU until the process clock has advanced
        pass
    after = process_cpu_s(os.getpid())
    assert before is not None and after is not None and after >= before
    assert process_cpu_s(os.getpid(), children=True) >= after
    assert process_cpu_s(None) is None
