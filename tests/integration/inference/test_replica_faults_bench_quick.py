"""`agentrl bench replicas --kill --quick` end to end: two replicas of the tiny model on a local Ray, the same
rollout without and with replica 0 killed in its middle. Its counts are asserted (its times are measurements): no
episode lost or cut short, every request the dead replica held retried once on the other one, one restart, and the
replacement back serving the weights pushed after the kill, then taking new requests at that version."""

from __future__ import annotations

import re

import pytest

from agentrl.cli import main

pytestmark = pytest.mark.slow


def test_bench_replicas_kill_quick_loses_no_episode_and_the_replica_comes_back_current(capsys):
    assert main(["bench", "replicas", "--kill", "--quick"]) == 0
    out = capsys.readouterr().out
    rows = {}
    for label in ("no kill", "replica 0 killed"):
        found = re.search(rf"^{label} +[\d.]+ +(\d+)/(\d+) +(\d+) +(\d+) +(\d+) +\d+/8$", out, re.M)
        assert found, out
        rows[label] = [int(x) for x in found.groups()]
    assert rows["no kill"] == [8, 8, 0, 0, 0]  # complete, of, lost, episodes retried, requests retried
    complete, total, lost, episodes_retried, requests_retried = rows["replica 0 killed"]
    assert (complete, total, lost) == (8, 8, 0)
    held = int(re.search(r"replica 0 died holding (\d+) requests", out)[1])
    assert held >= 1  # it was killed while holding work (at least the episode that paused it)
    assert episodes_retried == requests_retried == held  # each held request retried once, one per episode
    assert f"engine counters: replica_retries {held}, replica_restarts 1" in out
    assert re.search(r"recovery: replica 0 back [\d.]+ s after the kill, serving weight version 2 \(version 2 pushed "
                     r"[\d.]+ s after the kill, (while it restarted|after it was back)\); then it served 4 of 8 fresh "
                     r"requests, every token at version 2$", out, re.M), out
