"""What training prints: the first line of a run, one line per step and the no-learning-signal warning (durations,
progress lines and quieting third-party libraries: `agentrl.console`).

Every field of the step line is explained once, in `CONSOLE_FIELDS`; `CONSOLE_FIELDS_TEXT` is that explanation
as text for `agentrl train --help` and the docs. Output is plain text (no carriage returns, no ANSI codes), so
a log file reads like the terminal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from agentrl.console import format_duration


@dataclass(frozen=True)
class ConsoleField:
    key: str  # metric name in metrics.jsonl
    label: str  # what the step line shows
    fmt: str
    meaning: str


CONSOLE_FIELDS: tuple[ConsoleField, ...] = (
    ConsoleField("reward/mean", "reward", "{:.3f}", "mean reward of the episodes trained on this step"),
    ConsoleField("reward/success_rate", "succ", "{:.2f}", "fraction of those episodes that earned full reward"),
    ConsoleField("actor/pg_loss", "pg", "{:+.4f}", "clipped policy-gradient loss (mean over optimizer steps)"),
    ConsoleField("actor/kl_loss", "kl", "{:.4f}", "KL penalty to the reference policy (actor.use_kl_loss)"),
    ConsoleField("actor/entropy", "ent", "{:.3f}", "mean entropy of the policy on the sampled tokens"),
    ConsoleField("actor/grad_norm", "gnorm", "{:.3f}", "gradient norm before clipping to actor.grad_clip"),
    ConsoleField("drift/abs_max", "drift", "{:.1e}",
                 "max |rollout logprob - trainer logprob| on sampled tokens; large means engine and trainer "
                 "disagree about the policy (stale weights, dtype or temperature mismatch)"),
    ConsoleField("episode/response_tokens_mean", "len", "{:.0f}",
                 "mean response length in tokens (model turns and tool output)"),
    ConsoleField("data/infra_failed", "infra", "{:.0f}",
                 "episodes dropped because a tool, the sandbox or the engine failed (never trained as reward 0), "
                 "of those generated; `!` marks a step that had any (too many stop the run: docs/training.md)"),
    ConsoleField("data/zero_var_groups", "zvar", "{:.0f}",
                 "groups whose episodes all got the same reward: their advantages are 0, they teach nothing"),
    ConsoleField("val/reward/mean", "val", "{:.3f}", "mean reward on the validation tasks (every trainer.test_freq "
                                                     "steps, before step 1 and after the last)"),
    ConsoleField("timing/step_s", "s", "{:.1f}", "seconds the step took (rollout, update, weight sync)"),
)
NO_SIGNAL_NOTE = "no signal (all rewards equal in every group)"
NO_SIGNAL_WARN_AFTER = 5  # steps in a row without signal before the warning
NO_SIGNAL_WARNING = (f"warning: {NO_SIGNAL_WARN_AFTER} steps in a row without learning signal (every episode of a "
                     "group got the same reward): raise rollout.n or rollout.temperature, use easier tasks, check the "
                     "reward function on a few episodes.jsonl rows, or set algorithm.filter_zero_variance_groups=true")
SFT_FIELDS = (("loss", "token-mean negative log-likelihood of the assistant tokens [sft_loss]"),
              ("grad_norm", "gradient norm before clipping to actor.grad_clip [grad_norm]"),
              ("elapsed", "time since the first SFT step [elapsed_s]"),
              ("eta", "time left for the remaining SFT steps, from the mean time per step so far"))


def _fields_text() -> str:
    rows = [(f.label, f"{f.meaning} [{f.key}]") for f in CONSOLE_FIELDS]
    rows += [("eta", "time left for the remaining steps, from the mean time per step so far"),
             ("no signal", f"every group's episodes got equal rewards, so the step taught nothing; after "
                           f"{NO_SIGNAL_WARN_AFTER} such steps in a row a warning says what to change")]
    width = max(len(name) for name, _ in rows + list(SFT_FIELDS)) + 2
    lines = ["Each training step prints one line, `step N/TOTAL | field value | ...` (step 0: the validation "
             "before training); [names] are the metrics.jsonl keys:",
             *(f"  {name:<{width}}{meaning}" for name, meaning in rows),
             "SFT prints `sft step N/TOTAL | loss | grad_norm | elapsed | eta` every sft.log_freq steps:",
             *(f"  {name:<{width}}{meaning}" for name, meaning in SFT_FIELDS)]
    return "\n".join(lines)


CONSOLE_FIELDS_TEXT = _fields_text()


def run_header(kind: str, fields: dict[str, object]) -> str:
    """The first line of a run: `train: run dir runs/x | model runs/m | ...`."""
    return f"{kind}: " + " | ".join(f"{name} {value}" for name, value in fields.items())


def sft_line(step: int, total: int, metrics: dict[str, float], elapsed_s: float) -> str:
    parts = [f"sft step {step}/{total}", f"loss {metrics['sft_loss']:.4f}",
             f"grad_norm {metrics.get('grad_norm', math.nan):.3f}", f"elapsed {format_duration(elapsed_s)}"]
    if step < total:
        parts.append(f"eta {format_duration(elapsed_s / step * (total - step))}")
    return " | ".join(parts)


def has_no_signal(metrics: dict[str, float]) -> bool:
    """True when the step's groups all had equal rewards (every GRPO advantage 0); a step that lost every
    episode to infra failures is not counted (that is the `infra` field's story)."""
    return metrics.get("data/signal_groups") == 0 and metrics.get("data/zero_var_groups", 0) > 0


INFRA_KEY = "data/infra_failed"


def _infra_part(metrics: dict[str, float]) -> str:
    """`infra 5/64 !`: infra-failed of generated episodes, marked when any failed."""
    failed, generated = metrics[INFRA_KEY], metrics.get("data/episodes_generated")
    text = f"infra {failed:.0f}/{generated:.0f}" if generated else f"infra {failed:.0f}"
    return f"{text} !" if failed else text


class StepConsole:
    """Formats each step's line and warns after `NO_SIGNAL_WARN_AFTER` steps in a row without signal.

    The ETA is the mean of the seconds the logged steps took (step, validation and checkpoint time from the
    metrics) times the steps left, so it depends only on what was logged.
    """

    def __init__(self, total_steps: int | None = None):
        self.total_steps = total_steps
        self.no_signal_streak = 0
        self._seconds: list[float] = []

    def lines(self, step: int, metrics: dict[str, float]) -> list[str]:
        parts = [f"step {step}/{self.total_steps}" if self.total_steps else f"step {step}"]
        parts += [_infra_part(metrics) if f.key == INFRA_KEY else f"{f.label} {f.fmt.format(metrics[f.key])}"
                  for f in CONSOLE_FIELDS if f.key in metrics]
        if step == 0:  # the validation before training
            return [" | ".join(parts)]
        self._seconds.append(sum(metrics.get(k, 0.0) for k in ("timing/step_s", "timing/val_s", "timing/save_s")))
        if self.total_steps and step < self.total_steps:
            left = (self.total_steps - step) * sum(self._seconds) / len(self._seconds)
            parts.append(f"eta {format_duration(left)}")
        self.no_signal_streak = self.no_signal_streak + 1 if has_no_signal(metrics) else 0
        if self.no_signal_streak:
            parts.append(NO_SIGNAL_NOTE)
        out = [" | ".join(parts)]
        if self.no_signal_streak == NO_SIGNAL_WARN_AFTER:
            out.append(NO_SIGNAL_WARNING)
        return out


__all__ = [
    "CONSOLE_FIELDS",
    "CONSOLE_FIELDS_TEXT",
    "NO_SIGNAL_NOTE",
    "NO_SIGNAL_WARNING",
    "NO_SIGNAL_WARN_AFTER",
    "ConsoleField",
    "StepConsole",
    "has_no_signal",
    "run_header",
    "sft_line",
]
