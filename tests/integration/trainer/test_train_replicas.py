"""Training with `engine.replicas: 2` (two LocalEngines in Ray actors) trains what one in-process LocalEngine
trains: the same episodes token for token (the engine's seeded sampling does not depend on which replica or batch
a request runs in), so the weights each step pushes reach both replicas; the replicas serve the last step's
version."""

from __future__ import annotations

import json

import pytest

from agentrl.config import load_config
from agentrl.trainer.config import TrainConfig
from agentrl.trainer.metrics import read_metrics

pytestmark = pytest.mark.slow

FIELDS = ("step", "sample_index", "prompt_ids", "response_ids", "response_mask", "response_versions", "reward",
          "finish_reason", "infra_error")


def config(model_dir, tasks, run_dir, *extra) -> TrainConfig:
    return load_config(TrainConfig, "configs/calc_tiny_cpu.yaml", [
        f"model.path={model_dir}", f"data.train_files=[{tasks['train']}]", "data.val_files=[]",
        "data.train_batch_size=2", "rollout.n=4", "actor.ppo_mini_batch_size=1", "agent.max_new_tokens_per_turn=16",
        "agent.max_response_tokens=64", "agent.max_assistant_turns=2",
        "reward.custom={parity: 'train_rewards:first_token_parity'}", "actor.lr=1e-3", "actor.warmup_steps=0",
        "trainer.total_steps=2", "trainer.save_freq=0", "trainer.test_freq=0", "trainer.deterministic=true",
        "trainer.loggers=[jsonl]", "trainer.save_hf_model=false", "actor.world_size=1", "engine.num_threads=1",
        f"trainer.run_dir={run_dir}", *extra])


def episodes(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "episodes.jsonl").read_text().splitlines()]


def test_two_replicas_train_what_one_local_engine_trains(ray_session, tiny_model_dir, calc_tasks, tmp_path):
    from agentrl.trainer.loop import train

    one, two = tmp_path / "one", tmp_path / "two"
    train(config(tiny_model_dir, calc_tasks, one))
    train(config(tiny_model_dir, calc_tasks, two, "engine.replicas=2"))
    want, got = episodes(one), episodes(two)
    assert len(got) == 2 * 2 * 4
    assert [[e[k] for k in FIELDS] for e in got] == [[e[k] for k in FIELDS] for e in want]
    assert {v for e in got if e["step"] == 2 for v, m in zip(e["response_versions"], e["response_mask"]) if m} == {1}
    for w, g in zip(want, got):
        assert g["response_logprobs"] == pytest.approx(w["response_logprobs"], abs=1e-5)
    rows = [r for r in read_metrics(two) if "actor/pg_loss" in r]
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:  # the engine's replica counters are step metrics
        assert row["engine/replicas_up"] == 2 and row["engine/replica_retries"] == 0
