"""`agentrl train` with `rollout.agent_program`: an OpenAI Agents SDK agent (a function tool, its own tool loop)
runs every episode through the policy front on the tiny model, and two GRPO steps train on what it sampled."""

from __future__ import annotations

import json

import pytest

from agentrl.cli import main
from agentrl.trainer.metrics import read_metrics

pytestmark = pytest.mark.slow
pytest.importorskip("agents", reason="pip install -e '.[agents]'")


def test_two_steps_of_an_agents_sdk_agent(ray_session, tiny_model_dir, calc_tasks, tmp_path, capsys):
    run = tmp_path / "run"
    code = main(["train", "configs/calc_tiny_cpu.yaml", f"model.path={tiny_model_dir}",
                 f"data.train_files=[{calc_tasks['train']}]", f"data.val_files=[{calc_tasks['heldout']}]",
                 "data.train_batch_size=2", "rollout.n=4", "rollout.seed=0", "actor.ppo_mini_batch_size=2",
                 "agent.max_new_tokens_per_turn=16", "agent.max_response_tokens=64",
                 "rollout.agent_program=agent_programs:agents_sdk_agent",
                 "reward.custom={parity: 'train_rewards:first_token_parity'}",
                 "actor.lr=1e-3", "actor.warmup_steps=0", "trainer.total_steps=2", "trainer.save_freq=0",
                 "trainer.test_freq=0", "trainer.deterministic=true", "trainer.loggers=[jsonl]",
                 f"trainer.run_dir={run}"])
    assert code == 0, capsys.readouterr()
    rows = [r for r in read_metrics(run) if "actor/pg_loss" in r]
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert row["data/infra_failed"] == 0
        assert row["rollout/agent_splits"] == 0
        assert row["actor/grad_norm"] > 0  # the program's rewards differ within groups: the policy moved
    # Step 2 was sampled after the step-1 weight sync: the trainer's logprobs of the recorded tokens equal the
    # engine's, so the front recorded exactly what was sampled, under the right weights.
    assert rows[1]["drift/abs_max"] < 1e-4
    episodes = [json.loads(line) for line in (run / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == 2 * 2 * 4
    for ep in episodes:
        assert ep["metrics"]["reward_from"] == "program" and ep["reward"] in (0.0, 1.0)
        assert ep["messages"][0] == {"role": "system", "content": "Use the add tool, then answer."}
        assert sum(ep["response_mask"]) == len([v for v in ep["response_versions"] if v >= 0]) > 0
        assert set(ep["response_versions"]) - {-1} == {ep["step"] - 1}
