"""Step metrics: episode statistics, per-turn logprob drift and the sinks."""

from __future__ import annotations

import io
import json

import torch

from agentrl.trainer.metrics import (
    MetricsLogger,
    drift_metrics,
    episode_metrics,
    read_metrics,
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
    logger = MetricsLogger(tmp_path, ["console", "jsonl"], stream=out)
    logger.log(3, {"reward/mean": 0.25, "actor/pg_loss": -0.1, "timing/step_s": 2.0})
    logger.close()
    assert read_metrics(tmp_path) == [{"step": 3, "reward/mean": 0.25, "actor/pg_loss": -0.1, "timing/step_s": 2.0}]
    line = out.getvalue().strip()
    assert line.startswith("step 3 | reward 0.250") and "\n" not in line
    json.loads((tmp_path / "metrics.jsonl").read_text())
