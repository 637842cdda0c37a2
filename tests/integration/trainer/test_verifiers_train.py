"""`agentrl train` on a verifiers environment: `agentrl.envs.verifiers_env:verifiers_agent` runs verifiers' Env
on a taskset built in code (tests/vf_tiny_taskset.py) through the policy front on the tiny model; two GRPO steps
train on what was sampled, with the rewards verifiers' rubric gave."""

from __future__ import annotations

import json

import pytest

from agentrl.cli import main
from agentrl.trainer.metrics import read_metrics

pytestmark = pytest.mark.slow
pytest.importorskip("verifiers.v1", reason="pip install -e '.[agents]'")


def test_two_steps_on_a_verifiers_taskset(ray_session, tiny_model_dir, tmp_path, capsys):
    from vf_tiny_taskset import length_score

    rows = [{"prompt": [{"role": "user", "content": "(verifiers writes the prompt)"}], "reward": {"type": "env"},
             "task_id": f"vf-{i}", "data_source": "vf_tiny",
             "extra": {"verifiers": {"taskset": "vf_tiny_taskset", "idx": i}}} for i in (0, 1)]
    data = tmp_path / "vf.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = tmp_path / "run"
    code = main(["train", "configs/calc_tiny_cpu.yaml", f"model.path={tiny_model_dir}",
                 f"data.train_files=[{data}]", f"data.val_files=[{data}]",
                 "data.train_batch_size=2", "rollout.n=4", "rollout.seed=0", "actor.ppo_mini_batch_size=2",
                 "agent.max_new_tokens_per_turn=16", "agent.max_response_tokens=64",
                 "rollout.agent_program=agentrl.envs.verifiers_env:verifiers_agent",
                 "actor.lr=1e-3", "actor.warmup_steps=0", "trainer.total_steps=2", "trainer.save_freq=0",
                 "trainer.test_freq=0", "trainer.deterministic=true", "trainer.loggers=[jsonl]",
                 f"trainer.run_dir={run}"])
    assert code == 0, capsys.readouterr()
    steps = [r for r in read_metrics(run) if "actor/pg_loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["data/infra_failed"] == 0 for r in steps)
    assert steps[1]["drift/abs_max"] < 1e-4  # the recorded tokens are what the step-2 weights sampled
    episodes = [json.loads(line) for line in (run / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == 2 * 2 * 4
    for ep in episodes:
        assert ep["metrics"]["reward_from"] == "program"
        assert ep["messages"][0] == {"role": "system", "content": "Answer briefly."}
        assert ep["reward"] == length_score(ep["messages"][-1]["content"])  # verifiers' rubric on the answer
        assert sum(ep["response_mask"]) > 0
