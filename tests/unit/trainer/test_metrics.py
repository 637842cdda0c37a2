"""Step metrics: episode statistics, per-turn logprob drift, the sinks, and rewinding them for a resume."""

from __future__ import annotations

import io
import json

import pytest
import torch

from agentrl.trainer.metrics import (
    MetricsLogger,
    drift_metrics,
    episode_metrics,
    per_source_metrics,
    read_metrics,
    rewind_jsonl,
)
from agentrl.types import Episode


def test_episode_metrics_count_rewards_tools_and_errors_by_kind():
    eps = [Episode(uid="u", prompt_ids=[1], response_ids=[2, 3, 4], response_mask=[1, 0, 1],
                   response_logprobs=[-1, 0, -1], messages=[], reward=1.0, num_turns=2,
                   tool_calls=[{"name": "calculator"}], metrics={"tool_error_bad_arguments": 1}),
           Episode(uid="u", prompt_ids=[1], response_ids=[2], response_mask=[1], response_logprobs=[-1],
                   messages=[], reward=0.0, num_turns=1, finish_reason="length")]
    m = episode_metrics(eps)
    assert m["reward/mean"] == 0.5 and m["reward/success_rate"] == 0.5
    assert m["episode/model_tokens_mean"] == 1.5 and m["episode/response_tokens_mean"] == 2.0
    assert m["tools/calls"] == 1 and m["tools/errors_bad_arguments"] == 1
    assert m["episode/finish_length"] == 0.5


def test_per_source_metrics_split_a_mixed_set_by_data_source():
    def ep(source: str, reward: float) -> Episode:
        return Episode(uid="u", prompt_ids=[1], response_ids=[2], response_mask=[1], response_logprobs=[-1],
                       messages=[], reward=reward, data_source=source)

    m = per_source_metrics([ep("calc/train", 1.0), ep("calc/train", 0.5), ep("lookup/train", 0.0)], prefix="val/")
    assert m == {"val/calc/train/reward/mean": 0.75, "val/calc/train/reward/success_rate": 0.5,
                 "val/lookup/train/reward/mean": 0.0, "val/lookup/train/reward/success_rate": 0.0}
    assert per_source_metrics([ep("calc/train", 1.0)]) == {}  # one source: the overall metrics say it all


def test_drift_is_measured_on_loss_tokens_per_turn():
    rollout = torch.tensor([[0.0, -1.0, -2.0, -3.0]])
    old = torch.tensor([[5.0, -1.5, -2.0, -1.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0]])
    turns = torch.tensor([[-1, 0, 1, -1]])
    m = drift_metrics(rollout, old, mask, turns)
    assert m["drift/abs_max"] == 0.5 and m["drift/abs_mean"] == 0.25
    assert m["drift/turn0_abs_max"] == 0.5 and m["drift/turn1_abs_max"] == 0.0


def test_logger_writes_jsonl_and_one_console_line(tmp_path):
    out = io.StringIO()
    logger = MetricsLogger(tmp_path, ["console", "jsonl"], stream=out, total_steps=5)
    logger.log(3, {"reward/mean": 0.25, "actor/pg_loss": -0.1, "timing/step_s": 2.0})
    logger.close()
    assert read_metrics(tmp_path) == [{"step": 3, "reward/mean": 0.25, "actor/pg_loss": -0.1, "timing/step_s": 2.0}]
    line = out.getvalue().strip()
    assert line.startswith("step 3/5 | reward 0.250") and "\n" not in line
    json.loads((tmp_path / "metrics.jsonl").read_text())


def test_rewind_keeps_the_rows_up_to_a_step_and_drops_a_torn_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "x": s}) + "\n" for s in (0, 1, 2, 3, 4)) + '{"step": 5, "x"')
    assert rewind_jsonl(path, 2) > 0
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1, 2]
    assert rewind_jsonl(path, 2) == 0
    assert rewind_jsonl(tmp_path / "missing.jsonl", 2) == 0


def test_tensorboard_shows_each_step_once_after_a_resume(tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard is not installed (pip install -e '.[tensorboard]')")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    first = MetricsLogger(tmp_path, ["tensorboard"], experiment="run")
    for step in (1, 2, 3, 4):
        first.log(step, {"reward/mean": float(step)})
    first.close()
    resumed = MetricsLogger(tmp_path, ["tensorboard"], experiment="run", resumed_from=2)
    for step in (3, 4):
        resumed.log(step, {"reward/mean": 10.0 * step})
    resumed.close()
    events = EventAccumulator(str(tmp_path / "tensorboard" / "run"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("reward/mean")] == [(1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0)]
