"""`agentrl bench replicas --kill` refuses, in one line and before it builds or starts anything, what leaves it no
replica to survive the kill or no turn after it."""

from __future__ import annotations

import pytest

from agentrl.cli import main


@pytest.mark.parametrize("extra", [["--replicas", "1"], ["--turns", "1"]])
def test_kill_needs_two_replicas_and_two_turns(extra, capsys):
    assert main(["bench", "replicas", "--kill", *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --kill needs a replica to survive and a turn after the kill")
