"""End to end on the tiny model: classic PPO + GAE with a critic (configs/ppo_gae_tiny_cpu.yaml) trains both
models, reports the critic's metrics, checkpoints the critic and the adaptive reward-KL coefficient, and a resume
repeats the uninterrupted run; then one short run per outcome estimator, with the DAPO overlong penalty, masked
truncation and rollout correction switched on along the way."""

from __future__ import annotations

import shutil

import pytest
import torch

from agentrl.config import load_config
from agentrl.trainer.checkpoint import CRITIC_SHARDS_DIR, list_checkpoints
from agentrl.trainer.config import TrainConfig
from agentrl.trainer.metrics import read_metrics

pytestmark = pytest.mark.slow


def config(path, model_dir, tasks, run_dir, *extra) -> TrainConfig:
    return load_config(TrainConfig, path, [
        f"model.path={model_dir}", f"data.train_files=[{tasks['train']}]", "data.val_files=[]",
        "trainer.test_freq=0", "agent.max_new_tokens_per_turn=12", "agent.max_response_tokens=40",
        "agent.max_assistant_turns=2", "reward.custom={parity: 'train_rewards:first_token_parity'}",
        "tools.builtin=[calculator]", "actor.lr=1e-3", "actor.warmup_steps=0", "trainer.deterministic=true",
        "trainer.loggers=[jsonl]", "trainer.save_hf_model=false", f"trainer.run_dir={run_dir}", *extra])


def ppo_config(model_dir, tasks, run_dir, *extra) -> TrainConfig:
    return config("configs/ppo_gae_tiny_cpu.yaml", model_dir, tasks, run_dir, "data.train_batch_size=4",
                  "actor.ppo_mini_batch_size=2", "critic.ppo_mini_batch_size=2", "critic.lr=1e-3",
                  "trainer.total_steps=2", "trainer.save_freq=1", "algorithm.kl_ctrl.type=adaptive",
                  "algorithm.kl_ctrl.target_kl=0.01", "algorithm.kl_ctrl.horizon=10", *extra)


def critic_weights(checkpoint) -> dict[str, torch.Tensor]:
    from agentrl.trainer.export import load_weights

    return load_weights(checkpoint, CRITIC_SHARDS_DIR)


def comparable(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith(("timing/", "perf/"))}


def test_ppo_gae_trains_the_critic_and_resumes_it(ray_session, tiny_model_dir, calc_tasks, tmp_path):
    from transformers import AutoModelForCausalLM

    from agentrl.trainer.loop import train

    run = tmp_path / "run"
    train(ppo_config(tiny_model_dir, calc_tasks, run))
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        for key in ("critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean", "critic/values_mean",
                    "critic/returns_mean", "critic/grad_norm", "critic/lr", "actor/pg_loss", "actor/reward_kl_penalty",
                    "actor/reward_kl_penalty_coeff", "adv/std", "perf/critic_update_tokens_per_s"):
            assert key in row, key
        assert row["critic/grad_norm"] > 0 and row["actor/grad_norm"] > 0
        assert "actor/kl_loss" not in row  # the reference KL is in the reward, not in the loss
        assert "data/zero_var_groups" not in row  # groups of one are not zero-variance groups
    # The adaptive controller moved beta after step 1 (the policy was the reference: KL 0 < target).
    assert rows[0]["actor/reward_kl_penalty_coeff"] == pytest.approx(0.001)
    assert rows[1]["actor/reward_kl_penalty_coeff"] == pytest.approx(0.001 * (1 - 0.2 * 4 / 10))
    # The value model learned: its values and its weights moved between the steps.
    assert rows[1]["critic/values_mean"] != rows[0]["critic/values_mean"]
    steps = list_checkpoints(run)
    assert [p.name for p in steps] == ["step_000001", "step_000002"]
    first, second = critic_weights(steps[0]), critic_weights(steps[1])
    policy = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    assert any(not torch.equal(first[k], policy[k]) for k in first if k.startswith("model."))
    assert any(not torch.equal(first[k], second[k]) for k in first)
    uninterrupted = read_metrics(run)
    shutil.copytree(steps[1], tmp_path / "uninterrupted-step2")

    # Resumed from step 1: the critic, its optimizer and beta come back, so step 2 repeats itself.
    train(ppo_config(tiny_model_dir, calc_tasks, run, f"trainer.resume={steps[0]}"))
    resumed = read_metrics(run)
    assert [r["step"] for r in resumed] == [1, 2]
    for want, got in zip(uninterrupted, resumed):
        want, got = comparable(want), comparable(got)
        assert want.keys() == got.keys()
        for key in want:
            assert got[key] == pytest.approx(want[key], abs=1e-5), key
    again = critic_weights(list_checkpoints(run)[1])
    want = critic_weights(tmp_path / "uninterrupted-step2")
    for key in want:
        torch.testing.assert_close(again[key], want[key], atol=1e-6, rtol=0, msg=key)


@pytest.mark.parametrize("estimator, extra, expected", [
    # The random model never stops: every response runs into the 12-token turn limit, 12 > 40 - 36 tokens.
    ("grpo", ["reward.overlong_buffer.enable=true", "reward.overlong_buffer.len=36"],
     ["data/truncated_frac", "reward/overlong_penalty_mean"]),
    ("rloo", ["algorithm.rollout_correction.level=token"], ["rollout_corr/weight_mean", "rollout_corr/ess"]),
    ("reinforce_plus_plus", ["algorithm.rollout_correction.bypass_mode=true"], []),
    ("reinforce_plus_plus_baseline", ["algorithm.use_kl_in_reward=true"], ["actor/reward_kl_penalty"]),
])
def test_each_estimator_runs_a_step(ray_session, tiny_model_dir, calc_tasks, tmp_path, estimator, extra, expected):
    from agentrl.trainer.loop import train

    run = tmp_path / "run"
    metrics = train(config("configs/calc_tiny_cpu.yaml", tiny_model_dir, calc_tasks, run, "data.train_batch_size=2",
                           "rollout.n=2", "actor.ppo_mini_batch_size=2", "trainer.total_steps=1",
                           "trainer.save_freq=0", f"algorithm.adv_estimator={estimator}", *extra))
    assert metrics["actor/optimizer_steps"] == 1 and metrics["actor/skipped_steps"] == 0
    assert "critic/vf_loss" not in metrics  # no critic without gae
    for key in ("adv/mean", "adv/std", *expected):
        assert key in metrics, key
    if estimator == "grpo":
        assert metrics["reward/overlong_frac"] == 1.0 and metrics["reward/overlong_penalty_mean"] < 0
    if "bypass_mode=true" in " ".join(extra):
        assert "drift/abs_mean" not in metrics  # pi_old is the rollout policy: nothing recomputed
    else:
        assert "drift/abs_mean" in metrics


def test_ppo_gae_trains_in_async_mode(ray_session, tiny_model_dir, calc_tasks, tmp_path):
    """PPO + GAE off-policy: the critic's values are computed when the trainer takes the episodes (with the
    critic's weights of that step, however old the episodes), the loss corrected with token-level TIS."""
    from agentrl.trainer.loop import train

    run = tmp_path / "run"
    train(ppo_config(tiny_model_dir, calc_tasks, run, "trainer.mode=async", "trainer.max_staleness=1",
                     "trainer.total_steps=3", "trainer.save_freq=0", "algorithm.rollout_correction.level=token"))
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3]
    for row in rows:
        for key in ("critic/vf_loss", "critic/values_mean", "rollout_corr/weight_mean", "async/trainer_wait_s",
                    "rollout/staleness_mean"):
            assert key in row, key
        assert row["critic/grad_norm"] > 0 and row["actor/grad_norm"] > 0
        assert row["rollout/staleness_max"] <= 1 and row["data/groups"] == 4
    assert rows[2]["critic/values_mean"] != rows[0]["critic/values_mean"]
