"""Starting `agentrl train` in a run directory, so that the directory stays a faithful record of one run.

`plan_start(cfg)` decides how the run starts and checks the config before anything is written;
`prepare_run_dir(cfg, start)` then brings the directory to that start:

- complete: with `trainer.resume: auto`, a run whose COMPLETE file says it reached `trainer.total_steps` (or went
  beyond) is not run again; `final_model/` is left as it is. When the config differs from the run's (any key but
  `trainer.total_steps` and `trainer.resume`), one `CompletedRunError` names the keys and how to start a new run.
- resume from a checkpoint at step k (`auto`: the latest complete one in run_dir; or a checkpoint directory):
  the config must agree with the checkpoint's on every key of `FIXED_ON_RESUME`, else one `ResumeConfigError`
  names each key that differs; a config with a critic (`critic.enable`) needs a checkpoint that holds one,
  written by as many critic ranks as `critic.world_size`. Then metrics.jsonl and episodes.jsonl are cut after
  step k, TensorBoard hides its events after k, checkpoints after k (a continuation that is being replaced) are
  deleted, `final_model/` and COMPLETE are removed, and the config is written to `config.resume-<k>.yaml`:
  config.yaml stays the config of the first start. Every step then appears once, as an uninterrupted run writes it.
- fresh (`trainer.resume: never`, or `auto` with no checkpoint): an earlier run in run_dir is moved aside to
  `<run_dir>.old-N` and the run starts in an empty directory. A checkpoint outside run_dir starts run_dir the
  same way, at the checkpoint's step.

The configs written into run_dir and its checkpoints hold `RECORDED_PATHS` absolute, so `agentrl view`, `replay` and
`export` find the model and data from any directory.

Other keys may change on resume and take effect from the next step; `trainer.total_steps` stretches the LR
schedule (`agentrl.trainer.worker.lr_factor` is evaluated with the new total: from the next step on, the LR is
what a run planned with the new total from the start would use).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import yaml

from agentrl.agent_loop.rollout import EPISODES_FILE, TRAIN_RECORDS_FILE
from agentrl.config import save_config, to_dict
from agentrl.errors import UserError
from agentrl.trainer.checkpoint import (
    CONFIG_FILE,
    CRITIC_RANK_FILE,
    CRITIC_SHARDS_DIR,
    MARKER,
    checkpoint_step,
    checkpoints_root,
    list_checkpoints,
    marker_step,
    resolve_resume,
    write_marker,
)
from agentrl.trainer.config import TrainConfig
from agentrl.trainer.metrics import METRICS_FILE, rewind_jsonl

FINAL_MODEL_DIR = "final_model"
TENSORBOARD_DIR = "tensorboard"

# Keys a checkpoint is bound to: its weights and optimizer state belong to the model in this dtype, sharded over
# world_size ranks (under LoRA: adapters of this rank on these layers, scaled by alpha / rank), and its
# data-sampler position counts batches of these prompts in this order.
FIXED_ON_RESUME = ("model.path", "model.dtype", "actor.world_size", "data.train_files", "data.shuffle", "data.seed",
                   "data.train_batch_size", "actor.ppo_mini_batch_size", "rollout.n", "actor.lora.rank",
                   "actor.lora.alpha", "actor.lora.target_modules")
# Local paths of a config: absolute in the run's records, compared resolved.
RECORDED_PATHS = ("model.path", "model.tokenizer_path", "critic.model.path", "data.train_files", "data.val_files",
                  "tools.config")
# Keys a complete run may be asked again with other values: more steps resume it, resume=never starts over.
_FREE_WHEN_COMPLETE = ("trainer.total_steps", "trainer.resume")


class ResumeConfigError(UserError):
    """The config changed a key the checkpoint being resumed depends on."""


class CompletedRunError(UserError):
    """run_dir holds a complete run of another config: this config would not be trained."""


@dataclass(frozen=True)
class Start:
    step: int  # RL steps already done: 0 for a fresh run
    checkpoint: Path | None = None  # the checkpoint to load; None: fresh weights from model.path
    complete: bool = False  # nothing to do: the run already reached trainer.total_steps


def _dotted(tree: dict, key: str):
    """The value at a dotted key; None below a null section (`actor.lora: null`) or a key an older config lacks."""
    for part in key.split("."):
        if not isinstance(tree, dict):
            return None
        tree = tree.get(part)
    return tree


def _comparable(key: str, value):
    if key in RECORDED_PATHS and value is not None:
        return [str(Path(v).resolve()) for v in value] if isinstance(value, list) else str(Path(value).resolve())
    return value


def resume_mismatches(current: dict, saved: dict) -> list[str]:
    """`key (saved -> current)` for every key of FIXED_ON_RESUME whose value differs (paths compared resolved)."""
    out = []
    for key in FIXED_ON_RESUME:
        old, new = _dotted(saved, key), _dotted(current, key)
        if _comparable(key, old) != _comparable(key, new):
            out.append(f"{key} ({old!r} -> {new!r})")
    return out


def _leaves(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_leaves(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def config_changes(current: dict, saved: dict) -> list[str]:
    """`key (saved -> current)` for every key of `current` but `_FREE_WHEN_COMPLETE` whose value differs (paths
    resolved). A key only the saved config has is one this config does not read: a knob of a loss mode or an
    estimator it does not use (configs saved before the dumps left those out list every one), or a key agentrl
    no longer has; a change of mode shows in the mode's own key."""
    old, new = _leaves(saved), _leaves(current)
    return [f"{key} ({old.get(key)!r} -> {new.get(key)!r})" for key in sorted(new)
            if key not in _FREE_WHEN_COMPLETE and _comparable(key, old.get(key)) != _comparable(key, new.get(key))]


def latest_run_config(run_dir: Path) -> Path | None:
    """The config the run last ran with: its latest `config.resume-<k>.yaml`, else config.yaml."""
    resumed = sorted(run_dir.glob("config.resume-*.yaml"), key=lambda p: int(p.stem.rsplit("-", 1)[1]))
    first = run_dir / CONFIG_FILE
    return resumed[-1] if resumed else first if first.is_file() else None


def check_complete_run_config(cfg: TrainConfig, run_dir: Path, step: int) -> None:
    """Raise CompletedRunError when the complete run in run_dir ran another config than `cfg`."""
    saved = latest_run_config(run_dir)
    changes = config_changes(to_dict(cfg), yaml.safe_load(saved.read_text()) or {}) if saved else []
    if changes:
        shown = ", ".join(changes[:3]) + (f" and {len(changes) - 3} more" if len(changes) > 3 else "")
        raise CompletedRunError(f"{run_dir} holds a run completed at step {step} with another config ({shown}); "
                                "to train this config, set another trainer.run_dir, remove the directory, or pass "
                                "trainer.resume=never (moves it aside)")


def critic_mismatch(cfg: TrainConfig, checkpoint: Path) -> str | None:
    """Why the checkpoint cannot give this run its critic (none in it, or another number of ranks), or None."""
    if not cfg.critic.enable:
        return None  # a checkpoint's critic, if any, is simply not loaded
    if not (checkpoint / CRITIC_SHARDS_DIR).is_dir():
        return f"critic.enable (true here; the checkpoint has no {CRITIC_SHARDS_DIR}/: its run had no critic)"
    ranks = len(list(checkpoint.glob(CRITIC_RANK_FILE.format(rank="*"))))
    if ranks != cfg.critic.world_size:
        return f"critic.world_size ({ranks} -> {cfg.critic.world_size})"
    return None


def check_resume_config(cfg: TrainConfig, checkpoint: Path) -> None:
    """Raise ResumeConfigError naming every FIXED_ON_RESUME key on which `cfg` differs from the checkpoint's config,
    and a critic the checkpoint cannot provide."""
    saved_path = checkpoint / CONFIG_FILE
    diffs = resume_mismatches(to_dict(cfg), yaml.safe_load(saved_path.read_text())) if saved_path.is_file() else []
    critic = critic_mismatch(cfg, checkpoint)
    if critic:
        diffs.append(critic)
    if diffs:
        raise ResumeConfigError(f"cannot resume from {checkpoint}: the config differs from the checkpoint's in "
                                f"{', '.join(diffs)}; set those keys back, or start over with trainer.resume=never "
                                "(the earlier run is moved aside) or another trainer.run_dir")


def plan_start(cfg: TrainConfig) -> Start:
    """How this run starts; raises before anything is written when the checkpoint does not fit the config."""
    run_dir = Path(cfg.trainer.run_dir)
    if cfg.trainer.resume == "auto":
        done = marker_step(run_dir)
        if done is not None and done >= cfg.trainer.total_steps:
            check_complete_run_config(cfg, run_dir, done)
            return Start(step=done, complete=True)
    checkpoint = resolve_resume(cfg.trainer.resume, run_dir)
    if checkpoint is None:
        return Start(step=0)
    check_resume_config(cfg, checkpoint)
    return Start(step=checkpoint_step(checkpoint), checkpoint=checkpoint)


RECORDS = (METRICS_FILE, EPISODES_FILE, "checkpoints", FINAL_MODEL_DIR, TENSORBOARD_DIR, MARKER)


def has_records(run_dir: Path) -> bool:
    """True when run_dir holds what a run writes (a lone config.yaml does not count: nothing ran)."""
    return any((run_dir / name).exists() for name in RECORDS)


def move_aside(path: Path) -> Path:
    """Rename `path` to the first free `<path>.old-N` beside it and return the new path."""
    n = 1
    while (target := path.with_name(f"{path.name}.old-{n}")).exists():
        n += 1
    path.rename(target)
    return target


def rewind_run_dir(run_dir: Path, step: int) -> list[str]:
    """Bring run_dir's records back to the end of `step`; returns what was removed, for the console."""
    removed = [f"{name} rows after step {step}" for name in (METRICS_FILE, EPISODES_FILE, TRAIN_RECORDS_FILE)
               if rewind_jsonl(run_dir / name, step)]
    later = [p for p in list_checkpoints(run_dir) if checkpoint_step(p) > step]
    for path in later:
        shutil.rmtree(path)
    if later:
        removed.append(f"checkpoints {', '.join(p.name for p in later)}")
    if (run_dir / FINAL_MODEL_DIR).exists():
        shutil.rmtree(run_dir / FINAL_MODEL_DIR)
        removed.append(f"{FINAL_MODEL_DIR}/")
    (run_dir / MARKER).unlink(missing_ok=True)
    return removed


def _in_run_dir(checkpoint: Path, run_dir: Path) -> bool:
    return checkpoint.resolve().is_relative_to(checkpoints_root(run_dir).resolve())


def prepare_run_dir(cfg: TrainConfig, start: Start) -> list[str]:
    """Bring run_dir to `start` (see the module docstring) and write the config; returns notes for the console."""
    run_dir = Path(cfg.trainer.run_dir)
    notes, removed = [], []
    resuming_here = start.checkpoint is not None and _in_run_dir(start.checkpoint, run_dir)
    if resuming_here:
        removed = rewind_run_dir(run_dir, start.step)
    elif has_records(run_dir):
        why = ("trainer.resume=never" if cfg.trainer.resume == "never" else
               "no checkpoint to resume from" if start.checkpoint is None else "resuming from a checkpoint outside it")
        notes.append(f"{run_dir} holds an earlier run ({why}): moved it to {move_aside(run_dir)}")
    if start.checkpoint is not None:
        notes.append(f"resuming after step {start.step} from {start.checkpoint}"
                     + (f"; removed {', '.join(removed)}" if removed else ""))
    run_dir.mkdir(parents=True, exist_ok=True)
    first = start.checkpoint is None or not (run_dir / CONFIG_FILE).exists()
    save_config(cfg, run_dir, CONFIG_FILE if first else f"config.resume-{start.step}.yaml", path_keys=RECORDED_PATHS)
    return notes


def mark_complete(run_dir: str | Path, step: int) -> None:
    """Record that the run reached `step`: `trainer.resume: auto` will not run it again up to that step."""
    write_marker(Path(run_dir), step)


__all__ = [
    "FINAL_MODEL_DIR",
    "FIXED_ON_RESUME",
    "RECORDED_PATHS",
    "CompletedRunError",
    "ResumeConfigError",
    "Start",
    "check_complete_run_config",
    "check_resume_config",
    "config_changes",
    "critic_mismatch",
    "has_records",
    "mark_complete",
    "move_aside",
    "plan_start",
    "prepare_run_dir",
    "resume_mismatches",
    "rewind_run_dir",
]
