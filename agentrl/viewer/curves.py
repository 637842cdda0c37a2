"""What the viewer's curves page draws: the run's curve panels (the quickstart's curves.png list, then a few
more a run's health is read from), each with its series, its held-out marks and their legend labels.

The page (static/curves.js) draws every series as a faint raw line with a trailing `SMOOTHING_WINDOW`-step mean
on top, and the held-out metric (`val/` + the panel's key, logged every `trainer.test_freq` steps) as marks.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from agentrl.trainer.curve_panels import CURVE_PANELS, HELD_OUT_PREFIX, REFERENCE_KL, SMOOTHING_WINDOW, CurvePanel

# after the curves.png panels: turns, tool use, rollout-vs-trainer drift and time per step
MORE_PANELS = (
    CurvePanel("turns", "grpo", "episode/num_turns_mean", "assistant turns per episode", "turns", "GRPO step"),
    CurvePanel("tool calls", "grpo", "tools/calls_per_episode", "tool calls per episode", "calls", "GRPO step"),
    CurvePanel("logprob drift", "grpo", "drift/abs_mean", "mean |rollout − trainer logprob| on policy tokens",
               "nats per token", "GRPO step"),
    CurvePanel("step time", "grpo", "timing/step_s", "wall time of one step", "seconds", "GRPO step"),
)
# drawn on a panel beside its main series when the run logs them
ALSO = {"actor/ppo_kl": [REFERENCE_KL],
        "timing/step_s": [("timing/rollout_s", "rollout"), ("timing/update_s", "update")]}


def validation_settings(run_dir: Path) -> dict | None:
    """trainer.val_n, val_temperature and test_freq from the run's config.yaml (None without one)."""
    path = run_dir / "config.yaml"
    if not path.is_file():
        return None
    trainer = (yaml.safe_load(path.read_text()) or {}).get("trainer") or {}
    if not {"val_n", "val_temperature", "test_freq"} <= trainer.keys():
        return None
    return {k: trainer[k] for k in ("val_n", "val_temperature", "test_freq")}


def held_out_label(key: str, validation: dict | None) -> str:
    """The legend of a panel's held-out marks: pass@1 when validation samples once, greedily."""
    every = f", every {validation['test_freq']} steps" if validation and validation["test_freq"] else ""
    if key == "reward/success_rate" and validation:
        if validation["val_n"] == 1 and validation["val_temperature"] == 0:
            return f"held-out pass@1 (greedy{every})"
        return f"held-out success rate (n={validation['val_n']}, T={validation['val_temperature']}{every})"
    return f"held-out ({HELD_OUT_PREFIX}{key}{every})"


def curve_panels(run_dir: Path) -> dict:
    """The curves page's panels for a training run's metrics.jsonl, as JSON."""
    validation = validation_settings(run_dir)
    panels = []
    for panel in [p for p in CURVE_PANELS if p.source == "grpo"] + list(MORE_PANELS):
        series = [{"key": panel.key, "label": panel.label}]
        series += [{"key": k, "label": label} for k, label in ALSO.get(panel.key) or []]
        panels.append({**panel.to_json(), "series": series,
                       "held_out": {"key": HELD_OUT_PREFIX + panel.key,
                                    "label": held_out_label(panel.key, validation)}})
    return {"window": SMOOTHING_WINDOW, "panels": panels}


__all__ = ["MORE_PANELS", "curve_panels", "held_out_label", "validation_settings"]
