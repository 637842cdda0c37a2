"""Checkpoint directories: atomic commit, discovery of the latest complete one, pruning, driver state.

Layout under `run_dir/checkpoints/`:

    step_000004/            complete: renamed from step_000004.tmp after every file was written
        COMPLETE            json {step, time}; written last, before the rename
        actor/              sharded model + optimizer (torch.distributed.checkpoint, one file per rank); under
                            actor.lora the adapters and their optimizer state only
        worker_rank{r}.pt   LR scheduler, RNG states and step counters of rank r
        critic/             PPO with a critic: the value model's sharded model + optimizer
        critic_rank{r}.pt   and its scheduler, RNG states and step counters
        driver.pt           RL step, data-sampler position, reward-KL controller, driver RNG states
        config.yaml         the resolved training config that wrote it (checked when resuming)
        hf_config/          the model's config and tokenizer files: with actor/ a complete HF model
                            (`agentrl export`), whatever happens to model.path later
    step_000006.tmp/        being written (or a crash left it): never resumed from, removed by the next save

`resume: auto` picks the highest step directory that has COMPLETE and no `.tmp` suffix, so a half-written
checkpoint is never picked up. The frozen reference model is not saved: it is reloaded from `model.path`.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import time
from pathlib import Path

import torch

from agentrl.errors import UserError

_STEP_DIR = re.compile(r"^step_(\d+)$")
MARKER = "COMPLETE"
CONFIG_FILE = "config.yaml"
HF_FILES_DIR = "hf_config"
SHARDS_DIR = "actor"
CRITIC_SHARDS_DIR = "critic"
CRITIC_RANK_FILE = "critic_rank{rank}.pt"


class CheckpointError(UserError, FileNotFoundError):
    """A checkpoint directory that is missing, incomplete or not a checkpoint; the message names it and the fix."""


def checkpoints_root(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def begin_checkpoint(run_dir: str | Path, step: int) -> Path:
    """Create (empty) the temporary directory for step `step`'s checkpoint and return it."""
    tmp = checkpoints_root(run_dir) / f"step_{step:06d}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    return tmp


def commit_checkpoint(tmp: Path, step: int) -> Path:
    """Mark `tmp` complete and rename it to its final name (atomic on one filesystem); returns the final path."""
    if tmp.suffix != ".tmp":
        raise ValueError(f"commit_checkpoint expects a directory from begin_checkpoint, got {tmp}")
    write_marker(tmp, step)
    final = tmp.with_suffix("")
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    return final


def write_marker(directory: Path, step: int) -> None:
    """The COMPLETE file: json {step, time}, written when everything else in `directory` is."""
    (directory / MARKER).write_text(json.dumps({"step": step, "time": time.time()}))


def marker_step(directory: Path) -> int | None:
    """The step in `directory`'s COMPLETE file, or None when there is none."""
    path = directory / MARKER
    return int(json.loads(path.read_text())["step"]) if path.is_file() else None


def save_hf_files(path: Path, model_dir: str | Path, tokenizer_dir: str | Path | None = None) -> Path:
    """Copy the model's config and tokenizer files (everything of an HF model dir but the weights) into
    `path/hf_config`; the tokenizer files come from `tokenizer_dir` when it is given."""
    from agentrl.trainer.weight_sync import HF_SIDE_FILES

    out = path / HF_FILES_DIR
    out.mkdir(parents=True, exist_ok=True)
    model_files = ("config.json", "generation_config.json")
    for name in HF_SIDE_FILES:
        src = Path(model_dir if tokenizer_dir is None or name in model_files else tokenizer_dir) / name
        if src.is_file():
            shutil.copy2(src, out / name)
    return out


def is_complete(path: Path) -> bool:
    return path.is_dir() and _STEP_DIR.match(path.name) is not None and (path / MARKER).is_file()


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    root = checkpoints_root(run_dir)
    if not root.is_dir():
        return []
    done = [p for p in root.iterdir() if is_complete(p)]
    return sorted(done, key=lambda p: int(_STEP_DIR.match(p.name).group(1)))


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    done = list_checkpoints(run_dir)
    return done[-1] if done else None


def resolve_resume(resume: str, run_dir: str | Path) -> Path | None:
    """`trainer.resume` -> the checkpoint directory to load, or None to start fresh."""
    if resume == "never":
        return None
    if resume == "auto":
        return latest_checkpoint(run_dir)
    path = Path(resume)
    if not is_complete(path):
        raise CheckpointError(f"trainer.resume={resume!r} is not a complete checkpoint directory (a step_NNNNNN "
                              f"folder with a {MARKER} file); use 'auto', 'never' or such a folder")
    return path


def prune_checkpoints(run_dir: str | Path, keep: int) -> list[Path]:
    """Delete all but the newest `keep` complete checkpoints (keep 0: delete nothing) and stale .tmp folders."""
    removed = []
    root = checkpoints_root(run_dir)
    if root.is_dir():
        for p in root.glob("step_*.tmp"):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    if keep > 0:
        for p in list_checkpoints(run_dir)[:-keep]:
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


def checkpoint_step(path: Path) -> int:
    match = _STEP_DIR.match(path.name)
    if match is None:
        raise ValueError(f"{path} is not a step_NNNNNN checkpoint directory")
    return int(match.group(1))


def save_driver_state(path: Path, state: dict) -> None:
    """The driver's part: caller state (step, sampler position, ...) plus the driver's RNG states."""
    torch.save({**state, "torch_rng": torch.get_rng_state(), "python_rng": random.getstate()}, path / "driver.pt")


def load_driver_state(path: Path) -> dict:
    state = torch.load(path / "driver.pt", weights_only=False)
    torch.set_rng_state(state.pop("torch_rng"))
    random.setstate(state.pop("python_rng"))
    return state


__all__ = [
    "CONFIG_FILE",
    "CRITIC_RANK_FILE",
    "CRITIC_SHARDS_DIR",
    "HF_FILES_DIR",
    "MARKER",
    "SHARDS_DIR",
    "CheckpointError",
    "begin_checkpoint",
    "checkpoint_step",
    "commit_checkpoint",
    "is_complete",
    "latest_checkpoint",
    "list_checkpoints",
    "load_driver_state",
    "marker_step",
    "prune_checkpoints",
    "resolve_resume",
    "save_driver_state",
    "save_hf_files",
    "write_marker",
]
