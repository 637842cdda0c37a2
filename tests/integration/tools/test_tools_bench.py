"""`agentrl bench tools` end to end on a small load: both paths report, nothing fails, targets are judged."""

from __future__ import annotations

import re

import pytest

from agentrl.cli import main

pytestmark = pytest.mark.slow


def test_bench_tools_reports_both_paths_without_errors(capsys):
    assert main(["bench", "tools", "--calls", "40", "--concurrency", "8", "--latency-ms", "5"]) == 0
    out = capsys.readouterr().out
    assert "start-up heap frozen" in out
    for label in ("http", "in-process"):
        line = next(row for row in out.splitlines() if row.startswith(label + " "))
        assert re.search(r"ratio \d\.\d\d .* errors 0 .* gc: \d+ full", line), line
    assert re.search(r"http: \d+\.\d\dx the ideal rate, p99 overhead \d+\.\d\d ms over the tool's own latency",
                     out), out
