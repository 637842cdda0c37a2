"""Checkpoint directories: only complete ones are resumed from; pruning keeps the newest."""

from __future__ import annotations

import pytest

from agentrl.trainer.checkpoint import (
    begin_checkpoint,
    commit_checkpoint,
    latest_checkpoint,
    list_checkpoints,
    load_driver_state,
    prune_checkpoints,
    resolve_resume,
    save_driver_state,
)


def make(run_dir, step: int, *, commit: bool = True):
    tmp = begin_checkpoint(run_dir, step)
    (tmp / "payload").write_text(str(step))
    return commit_checkpoint(tmp, step) if commit else tmp


def test_half_written_checkpoints_are_never_picked_up(tmp_path):
    make(tmp_path, 2)
    make(tmp_path, 10)
    make(tmp_path, 12, commit=False)  # crashed while writing
    (tmp_path / "checkpoints" / "step_000011").mkdir()  # renamed by hand, no COMPLETE marker
    assert latest_checkpoint(tmp_path).name == "step_000010"
    assert resolve_resume("auto", tmp_path).name == "step_000010"
    assert resolve_resume("never", tmp_path) is None
    with pytest.raises(FileNotFoundError, match="complete checkpoint"):
        resolve_resume(str(tmp_path / "checkpoints" / "step_000012.tmp"), tmp_path)


def test_fresh_run_dir_has_nothing_to_resume(tmp_path):
    assert resolve_resume("auto", tmp_path) is None


def test_prune_keeps_the_newest_and_removes_stale_tmp(tmp_path):
    for step in (1, 2, 3):
        make(tmp_path, step)
    make(tmp_path, 4, commit=False)
    prune_checkpoints(tmp_path, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_000002", "step_000003"]
    assert not (tmp_path / "checkpoints" / "step_000004.tmp").exists()


def test_driver_state_restores_rng(tmp_path):
    import random

    import torch

    path = make(tmp_path, 1)
    save_driver_state(path, {"step": 1, "sampler": {"epoch": 0, "index": 3}})
    expected = (torch.rand(3), random.random())
    state = load_driver_state(path)
    assert state == {"step": 1, "sampler": {"epoch": 0, "index": 3}}
    assert torch.equal(torch.rand(3), expected[0]) and random.random() == expected[1]
