"""Step metrics: pure functions from episodes / batch tensors to flat dicts, and the loggers that write them.

Names are grouped by prefix: `reward/`, `episode/`, `tools/`, `adv/`, `actor/`, `critic/`, `drift/`,
`rollout_corr/`, `timing/`, `perf/`, `data/`, `val/`. Every step writes one JSON line to `run_dir/metrics.jsonl`,
one console line (`agentrl.trainer.console`), and optionally TensorBoard (`tensorboard` in trainer.loggers) and
W&B (`wandb`) scalars.

Each step appears once in every sink: a run resumed from step k first cuts the JSON-lines files after step k
(`rewind_jsonl`), and TensorBoard hides its events after k (`purge_step`), so a reader sees what an
uninterrupted run would have written.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from agentrl.evaluation.metrics import summarize
from agentrl.trainer.console import StepConsole
from agentrl.types import Episode

METRICS_FILE = "metrics.jsonl"

SUCCESS_REWARD = 1.0  # an episode "succeeds" when it earns full reward


def _mean_std(values: list[float]) -> tuple[float, float]:
    if not values:
        return 0.0, 0.0
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / len(values)
    return mean, math.sqrt(var)


def success_rate(rewards: list[float]) -> float:
    """Share of rewards at full reward (`SUCCESS_REWARD`, up to float rounding)."""
    return sum(r >= SUCCESS_REWARD - 1e-9 for r in rewards) / len(rewards)


def episode_metrics(episodes: list[Episode], prefix: str = "") -> dict[str, float]:
    """Reward, length, turn and tool statistics of the episodes that are trained on (or validated)."""
    if not episodes:
        return {}
    rewards = [ep.reward for ep in episodes]
    mean, std = _mean_std(rewards)
    out = {
        f"{prefix}reward/mean": mean,
        f"{prefix}reward/std": std,
        f"{prefix}reward/max": max(rewards),
        f"{prefix}reward/min": min(rewards),
        f"{prefix}reward/success_rate": success_rate(rewards),
        f"{prefix}episode/model_tokens_mean": _mean_std([float(sum(ep.response_mask)) for ep in episodes])[0],
        f"{prefix}episode/response_tokens_mean": _mean_std([float(len(ep.response_ids)) for ep in episodes])[0],
        f"{prefix}episode/response_tokens_max": float(max(len(ep.response_ids) for ep in episodes)),
        f"{prefix}episode/prompt_tokens_mean": _mean_std([float(len(ep.prompt_ids)) for ep in episodes])[0],
        f"{prefix}episode/num_turns_mean": _mean_std([float(ep.num_turns) for ep in episodes])[0],
        f"{prefix}tools/calls_per_episode": _mean_std([float(len(ep.tool_calls)) for ep in episodes])[0],
    }
    for reason, count in Counter(ep.finish_reason for ep in episodes).items():
        out[f"{prefix}episode/finish_{reason}"] = count / len(episodes)
    errors: Counter = Counter()
    calls = 0
    for ep in episodes:
        calls += len(ep.tool_calls)
        for key, value in ep.metrics.items():
            if key.startswith("tool_error_") and isinstance(value, (int, float)):
                errors[key.removeprefix("tool_error_")] += value
    out[f"{prefix}tools/calls"] = float(calls)
    out[f"{prefix}tools/errors"] = float(sum(errors.values()))
    for kind, count in errors.items():
        out[f"{prefix}tools/errors_{kind}"] = float(count)
    return out


def per_source_metrics(episodes: list[Episode], prefix: str = "") -> dict[str, float]:
    """Mean reward and success rate per `data_source` (`{prefix}{source}/reward/mean`, `.../success_rate`) when
    the episodes come from more than one source: a mixed validation set's mean hides one suite getting worse
    while another improves. The statistics are `agentrl eval`'s (`summarize`'s `by_data_source`)."""
    by_source = summarize(episodes, success_threshold=SUCCESS_REWARD - 1e-9).get("by_data_source", {})
    out = {}
    for source, stats in by_source.items():
        if "mean_reward" in stats:  # absent when every episode of the source failed for infra reasons
            out[f"{prefix}{source}/reward/mean"] = stats["mean_reward"]
            out[f"{prefix}{source}/reward/success_rate"] = stats["mean@n"]
    return out


@contextmanager
def timed(key: str, out: dict[str, float]) -> Iterator[None]:
    """Add the wall-clock seconds of the `with` body to out[key]."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        out[key] = out.get(key, 0.0) + time.perf_counter() - t0


def _masked_stats(prefix: str, x_B_L: torch.Tensor, mask_B_L: torch.Tensor) -> dict[str, float]:
    values = x_B_L[mask_B_L.bool()]
    if values.numel() == 0:
        return {}
    return {f"{prefix}mean": float(values.mean()), f"{prefix}std": float(values.std(unbiased=False)),
            f"{prefix}max": float(values.max()), f"{prefix}min": float(values.min())}


def advantage_metrics(adv_B_L: torch.Tensor, mask_B_L: torch.Tensor) -> dict[str, float]:
    """Advantages over loss tokens (one value per token: an outcome estimator's per-trajectory advantage counts
    once per token of the trajectory)."""
    out = _masked_stats("adv/", adv_B_L, mask_B_L)
    if out:
        out["adv/zero_frac"] = float((adv_B_L[mask_B_L.bool()] == 0).float().mean())
    return out


def value_metrics(values_B_L: torch.Tensor, returns_B_L: torch.Tensor, mask_B_L: torch.Tensor) -> dict[str, float]:
    """The critic's values before the update and the GAE returns it is trained towards, over loss tokens."""
    keep = mask_B_L.bool()
    if not bool(keep.any()):
        return {}
    values, returns = values_B_L[keep], returns_B_L[keep]
    explained = 1 - float((returns - values).var(unbiased=False)) / max(float(returns.var(unbiased=False)), 1e-8)
    return {"critic/values_mean": float(values.mean()), "critic/returns_mean": float(returns.mean()),
            "critic/values_max": float(values.max()), "critic/values_min": float(values.min()),
            "critic/vf_explained_var": explained}


def drift_metrics(rollout_logprobs_B_L: torch.Tensor, old_logprobs_B_L: torch.Tensor, loss_mask_B_L: torch.Tensor,
                  turn_ids_B_L: torch.Tensor | None = None, max_turns: int = 8) -> dict[str, float]:
    """Rollout-vs-trainer logprob drift |rollout_logp - old_logp| on loss tokens, overall and per turn index.

    Large drift means the engine and the trainer disagree about the policy (stale weights, dtype, kernel or
    temperature mismatch) and the PPO ratio is no longer anchored to the sampling policy.
    """
    mask = loss_mask_B_L.bool()
    if not bool(mask.any()):
        return {}
    diff = (rollout_logprobs_B_L - old_logprobs_B_L).abs()
    out = {"drift/abs_mean": float(diff[mask].mean()), "drift/abs_max": float(diff[mask].max()),
           "drift/rollout_minus_old_mean": float((rollout_logprobs_B_L - old_logprobs_B_L)[mask].mean())}
    if turn_ids_B_L is not None:
        for turn in range(max_turns):
            sel = mask & (turn_ids_B_L == turn)
            if bool(sel.any()):
                out[f"drift/turn{turn}_abs_mean"] = float(diff[sel].mean())
                out[f"drift/turn{turn}_abs_max"] = float(diff[sel].max())
    return out


class MetricsLogger:
    """Writes each step's metrics to the configured sinks: console, jsonl, tensorboard, wandb.

    `resumed_from`: the step the run resumes after (0 for a fresh run); TensorBoard purges its events after it.
    `total_steps`: shown in the console line (`step 3/20`) and used for its ETA.
    """

    def __init__(self, run_dir: str | Path, loggers: list[str], *, project: str = "agentrl", experiment: str = "",
                 config: dict | None = None, stream=None, total_steps: int | None = None, resumed_from: int = 0):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.loggers = list(loggers)
        self.stream = stream or sys.stdout
        self.console = StepConsole(total_steps) if "console" in self.loggers else None
        self._jsonl = open(self.run_dir / METRICS_FILE, "a") if "jsonl" in self.loggers else None
        self._tb = None
        self._wandb = None
        name = experiment or self.run_dir.name
        if "tensorboard" in self.loggers:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as e:
                raise ImportError("trainer.loggers has 'tensorboard' but the tensorboard package is missing: "
                                  "pip install tensorboard, or drop it from trainer.loggers") from e
            # purge_step: TensorBoard hides this directory's older events at and after it (a resume's re-run steps)
            self._tb = SummaryWriter(log_dir=str(self.run_dir / "tensorboard" / name),
                                     purge_step=resumed_from + 1 if resumed_from > 0 else None)
        if "wandb" in self.loggers:
            try:
                import wandb
            except ImportError as e:
                raise ImportError("trainer.loggers has 'wandb' but wandb is not installed: pip install wandb, "
                                  "or drop it from trainer.loggers") from e
            self._wandb = wandb.init(project=project, name=name, config=config, dir=str(self.run_dir))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        clean = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
        if self._jsonl is not None:
            self._jsonl.write(json.dumps({"step": step, **clean}) + "\n")
            self._jsonl.flush()
        if self.console is not None:
            for line in self.console.lines(step, clean):
                print(line, file=self.stream, flush=True)
        if self._tb is not None:
            for key, value in clean.items():
                self._tb.add_scalar(key, value, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(clean, step=step)

    def close(self) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def read_metrics(run_dir: str | Path) -> list[dict]:
    """All rows of run_dir/metrics.jsonl, one per logged step, in step order."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def rewind_jsonl(path: str | Path, step: int) -> int:
    """Cut a JSON-lines file whose rows carry a "step" (in step order) just before the first row after `step`,
    or before a torn last line a crash left; returns the number of bytes removed (0 if the file is missing)."""
    path = Path(path)
    if not path.is_file():
        return 0
    size = path.stat().st_size
    keep = 0
    with path.open("rb") as f:
        for line in f:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                break
            if row["step"] > step:
                break
            keep += len(line)
    if keep < size:
        os.truncate(path, keep)
    return size - keep


__all__ = [
    "SUCCESS_REWARD",
    "MetricsLogger",
    "METRICS_FILE",
    "advantage_metrics",
    "drift_metrics",
    "episode_metrics",
    "read_metrics",
    "rewind_jsonl",
    "timed",
    "value_metrics",
]
