"""The panels of a run's curves: which metrics to draw, with what titles and units, and how they are smoothed.

One list for both pictures of a run: the quickstart's curves.png (matplotlib) and the curves page of
`agentrl view` (SVG in the browser). Every series is drawn as a faint raw line with a trailing
`SMOOTHING_WINDOW`-step mean on top; the validation metrics (`val/` + the panel's key, logged every
`trainer.test_freq` steps) are marked on the panel of their training metric as the held-out figure.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

SMOOTHING_WINDOW = 10  # steps in the trailing mean drawn over the raw line
HELD_OUT_PREFIX = "val/"  # trainer.loop.validate logs the held-out metrics under this prefix


@dataclass(frozen=True)
class CurvePanel:
    title: str
    source: str  # "sft": an SFT run's sft_metrics.jsonl, "grpo": a training run's metrics.jsonl
    key: str  # the metrics.jsonl key drawn
    label: str  # what the line is, for the legend
    unit: str  # the y axis
    x_label: str  # the x axis

    def to_json(self) -> dict:
        return asdict(self)


CURVE_PANELS = (
    CurvePanel("SFT loss", "sft", "sft_loss", "token-mean NLL", "nats per assistant token", "SFT optimizer step"),
    CurvePanel("GRPO train reward", "grpo", "reward/mean", "mean reward per episode", "reward (0-1)", "GRPO step"),
    CurvePanel("GRPO success", "grpo", "reward/success_rate", "train episodes with full reward",
               "fraction of episodes", "GRPO step"),
    CurvePanel("KL", "grpo", "actor/ppo_kl", "ppo_kl: update vs the rollout's old policy", "nats per token",
               "GRPO step"),
    CurvePanel("entropy", "grpo", "actor/entropy", "policy entropy on sampled tokens", "nats per token", "GRPO step"),
    CurvePanel("response length", "grpo", "episode/model_tokens_mean", "model tokens per episode", "tokens",
               "GRPO step"),
)
# drawn on the KL panel beside ppo_kl when the run logs it (actor.use_kl_loss)
REFERENCE_KL = ("actor/kl", "actor/kl: policy vs the reference (SFT) model")


def moving_average(values: list[float], window: int = SMOOTHING_WINDOW) -> list[float]:
    """Trailing mean over the last `window` values (fewer at the start), same length as `values`."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


__all__ = ["CURVE_PANELS", "CurvePanel", "HELD_OUT_PREFIX", "REFERENCE_KL", "SMOOTHING_WINDOW", "moving_average"]
