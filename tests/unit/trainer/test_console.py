"""The console: one plain line per step with an ETA, the no-signal note and warning, progress lines for logs."""

from __future__ import annotations

import io

from agentrl.console import ProgressLines, format_duration, progress
from agentrl.trainer.console import CONSOLE_FIELDS, CONSOLE_FIELDS_TEXT, NO_SIGNAL_WARN_AFTER, StepConsole, run_header

FLAT = {"data/groups": 2.0, "data/zero_var_groups": 2.0, "data/signal_groups": 0.0, "timing/step_s": 2.0}
MIXED = {"data/groups": 2.0, "data/zero_var_groups": 1.0, "data/signal_groups": 1.0, "timing/step_s": 2.0}


def test_step_line_shows_progress_and_an_eta_from_the_logged_step_times():
    console = StepConsole(total_steps=5)
    first = console.lines(1, {"reward/mean": 0.5, **MIXED})
    assert first == ["step 1/5 | reward 0.500 | zvar 1 | s 2.0 | eta 8s"]
    second = console.lines(2, {**MIXED, "timing/step_s": 4.0, "timing/val_s": 2.0})
    assert second[0].endswith("eta 12s")  # (2 + 6) / 2 s per step, 3 steps left
    assert "eta" not in console.lines(5, MIXED)[0]
    assert console.lines(0, {"val/reward/mean": 0.25}) == ["step 0/5 | val 0.250"]


def test_steps_without_signal_are_marked_and_warned_about_once_per_streak():
    console = StepConsole(total_steps=100)
    out = [console.lines(step, FLAT) for step in range(1, NO_SIGNAL_WARN_AFTER + 3)]
    assert all("no signal" in lines[0] for lines in out)
    warnings = [line for lines in out for line in lines[1:]]
    assert len(warnings) == 1 and warnings[0].startswith(f"warning: {NO_SIGNAL_WARN_AFTER} steps in a row")
    for advice in ("rollout.n", "rollout.temperature", "easier tasks", "reward function",
                   "algorithm.filter_zero_variance_groups"):
        assert advice in warnings[0]
    assert "no signal" not in console.lines(50, MIXED)[0] and console.no_signal_streak == 0
    # a step that lost every episode to infra failures is not a "no signal" step
    assert "no signal" not in console.lines(51, {"data/groups": 0.0, "data/signal_groups": 0.0})[0]


def test_progress_lines_are_plain_and_come_every_tenth():
    out = io.StringIO()
    bar = progress(20, "eval after SFT", stream=out)
    assert isinstance(bar, ProgressLines)
    for _ in range(20):
        bar.update(1)
    bar.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 10
    assert lines[0].startswith("eval after SFT: 2/20 episodes (10%), ") and "eta" in lines[0]
    assert lines[-1].startswith("eval after SFT: 20/20 episodes (100%), ") and "eta" not in lines[-1]
    assert "\r" not in out.getvalue() and "\x1b" not in out.getvalue()


def test_every_console_field_is_explained_once():
    for field in CONSOLE_FIELDS:
        assert CONSOLE_FIELDS_TEXT.count(f"  {field.label} ") == 1, field.label
        assert f"[{field.key}]" in CONSOLE_FIELDS_TEXT
    for word in ("eta", "no signal", "loss", "grad_norm"):
        assert f"  {word} " in CONSOLE_FIELDS_TEXT


def test_header_and_durations_read_plainly():
    assert run_header("train", {"run dir": "runs/x", "steps": 3}) == "train: run dir runs/x | steps 3"
    assert [format_duration(s) for s in (4.4, 65, 3725)] == ["4s", "1m05s", "1h02m"]


def test_a_step_with_infra_failures_is_marked():
    console = StepConsole(total_steps=4)
    assert " | infra 5/64 ! | " in console.lines(3, {"data/infra_failed": 5.0, "data/episodes_generated": 64.0,
                                                      "timing/step_s": 1.0})[0]
    assert " | infra 0/64 | " in console.lines(4, {"data/infra_failed": 0.0, "data/episodes_generated": 64.0,
                                                   "timing/step_s": 1.0, "data/zero_var_groups": 0.0})[0]
