"""When a training run stops on its own, and what it says (docs/training.md, "When a run stops").

A run stops with one `error:` line on the console and the traceback in `run_dir/train.log` (`RUN_LOG`):

- a reward function raised (`reward.on_error: raise`, the default): `rewards.RewardError`, exit code 2. The line
  names the reward, the exception with the line that raised it, and the task (task id, file and row).
- its infrastructure failed (`InfraFailureError`, exit code 3): `infra_stop_rule` over the share of each step's
  episodes that failed for an infrastructure reason (tool service, sandbox or engine down, after the clients'
  retries). The line names the step, the rule, the service with its URL and what failed (`infra_cause`).

The infrastructure check runs after a step's rollout and before its update, so the stopped step leaves no trace
in the records a resume keeps: the trainer saves a checkpoint of the step before it (unless one exists) and a
rerun of the same command rewinds episodes.jsonl to it and goes on (`agentrl.trainer.resume`).
"""

from __future__ import annotations

import datetime
import traceback
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from agentrl.agent_loop.rewards import RewardError
from agentrl.errors import InfraFailureError
from agentrl.tools.base import INFRA_ERROR_KINDS
from agentrl.tools.remote import excerpt
from agentrl.types import Episode, Task

RUN_LOG = "train.log"  # in run_dir: when each start began, and the traceback of every error that stopped the run


@dataclass(frozen=True)
class InfraLimits:
    """The `trainer.*` keys of the infrastructure stop rule."""

    max_fraction: float  # trainer.max_infra_failed_fraction: one step above it stops the run
    streak_fraction: float  # trainer.infra_streak_fraction
    streak_steps: int  # trainer.infra_streak_steps: this many steps in a row above streak_fraction stop it (0: off)

    @classmethod
    def of(cls, trainer) -> InfraLimits:
        """The limits of a `TrainerConfig`."""
        return cls(trainer.max_infra_failed_fraction, trainer.infra_streak_fraction, trainer.infra_streak_steps)


def infra_stop_rule(counts: list[tuple[int, int]], limits: InfraLimits) -> str | None:
    """Which rule stops the run after the last step of `counts`, or None to go on.

    `counts`: (infra-failed, generated) episodes of each step this process ran, oldest first, the step just rolled
    out last. A step stops the run when its failed share is above `max_fraction`, or when it is the
    `streak_steps`-th step in a row whose share is above `streak_fraction`."""
    failed, generated = counts[-1]
    if generated and failed / generated > limits.max_fraction:
        return f"more than trainer.max_infra_failed_fraction={limits.max_fraction:g}"
    recent = counts[-limits.streak_steps:] if limits.streak_steps else []
    if len(recent) == limits.streak_steps and recent and all(g and f / g > limits.streak_fraction for f, g in recent):
        return (f"more than trainer.infra_streak_fraction={limits.streak_fraction:g} for "
                f"trainer.infra_streak_steps={limits.streak_steps} steps in a row")
    return None


def _episode_cause(episode: Episode, services: dict[str, str]) -> tuple[str, str]:
    """(what failed, a short detail) for one infra-failed episode."""
    for call in episode.tool_calls:
        if call.get("error_kind") in INFRA_ERROR_KINDS:
            service = (call.get("metrics") or {}).get("service", "")
            where = services.get(service, f"tool service {service!r}")
            detail = excerpt(str((call.get("response") or {}).get("content", "")))
            return f"{where} failed calls to tool {call['name']!r} ({call['error_kind']})", detail
    if "infra_detail" in episode.metrics:  # engine, sandbox, prompt too long
        return excerpt(str(episode.metrics["infra_detail"]), 200), ""
    if episode.finish_reason == "timeout":
        return (f"episodes ran past agent.episode_timeout_s (waiting for the "
                f"{episode.metrics.get('timeout_phase', 'engine or tools')})"), ""
    return f"episodes ended with {episode.finish_reason} ({episode.metrics.get('stop_detail', '')})", ""


def infra_cause(episodes: list[Episode], services: dict[str, str]) -> str:
    """The most common cause among the infra-failed `episodes`, e.g. "tool service 'calc' at http://127.0.0.1:8123
    failed calls to tool 'calc' (unreachable: Error: tool service calc is unreachable (ConnectError)) in 7 of
    them". `services`: tool service name -> how to name it ("tool service 'calc' at URL")."""
    causes: Counter[str] = Counter()
    details: dict[str, str] = {}
    for episode in episodes:
        if episode.infra_error:
            cause, detail = _episode_cause(episode, services)
            causes[cause] += 1
            details.setdefault(cause, detail)
    if not causes:
        return "no infra-failed episode says why"
    cause, count = causes.most_common(1)[0]
    detail = f": {details[cause]}" if details[cause] else ""
    return f"{cause}{detail} in {count} of them" if len(causes) > 1 else f"{cause}{detail}"


class InfraWatch:
    """Applies `infra_stop_rule` to each step's rollout; `check` raises InfraFailureError to stop the run."""

    def __init__(self, limits: InfraLimits, services: dict[str, str]):
        self.limits, self.services = limits, services
        self.counts: list[tuple[int, int]] = []

    def check(self, step: int, episodes: list[Episode]) -> None:
        failed = sum(ep.infra_error for ep in episodes)
        self.counts.append((failed, len(episodes)))
        rule = infra_stop_rule(self.counts, self.limits)
        if rule is not None:
            raise InfraFailureError(f"step {step}: {failed} of {len(episodes)} episodes failed for an "
                                    f"infrastructure reason, {rule}: {infra_cause(episodes, self.services)}")


def resume_hint(error: InfraFailureError, checkpoint_step: int | None, run_dir: Path, *,
                auto: bool) -> InfraFailureError:
    """`error` with what to do next: how to rerun, where the rerun resumes, and where the traceback is. `auto`:
    the run's trainer.resume is "auto" (otherwise the rerun needs trainer.resume=auto to resume)."""
    rerun = "run the same command again" if auto else "run the command again with trainer.resume=auto"
    then = f"it resumes after step {checkpoint_step}" if checkpoint_step else "it starts over (no step was completed)"
    return InfraFailureError(f"{error}; bring the service back and {rerun}: {then} (traceback in {run_dir / RUN_LOG})")


def log_line(run_dir: str | Path, text: str) -> None:
    """Append a timestamped line to run_dir/train.log."""
    with (Path(run_dir) / RUN_LOG).open("a", encoding="utf-8") as f:
        f.write(f"{datetime.datetime.now().isoformat(timespec='seconds')} {text}\n")


def log_failure(run_dir: str | Path, error: BaseException, origins: list[tuple[Task, str]]) -> None:
    """Write `error`'s traceback to run_dir/train.log. A `RewardError` first learns its task's file and row (from
    `origins`, (task, "file:row N") pairs) and the log's path, which its one-line message shows."""
    path = Path(run_dir) / RUN_LOG
    if isinstance(error, RewardError):
        error.origin = next((where for task, where in origins if task is error.task), None)
        error.log_file = str(path)
    text = "".join(traceback.format_exception(error))
    log_line(run_dir, f"stopped: {type(error).__name__}: {error}\n{text}")


__all__ = ["InfraLimits", "InfraWatch", "RUN_LOG", "infra_cause", "infra_stop_rule", "log_failure", "log_line",
           "resume_hint"]
