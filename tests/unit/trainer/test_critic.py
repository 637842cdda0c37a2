"""The critic in-process (one gloo rank): values are aligned with the batch layout and do not depend on
micro-batching, the value loss falls when the critic is trained towards fixed returns, the body starts as the
policy's, and a checkpoint restores its weights and optimizer state bit for bit next to the policy's."""

from __future__ import annotations

import pytest
import torch
from test_worker import ragged_episodes

from agentrl.trainer.batch import episodes_to_batch
from agentrl.trainer.config import ActorConfig, CriticConfig, ModelConfig
from agentrl.trainer.critic import CriticGroup, critic_model
from agentrl.trainer.worker import WorkerGroup


def critic_config(**changes) -> CriticConfig:
    base = CriticConfig(lr=1e-3, grad_clip=1e6, max_tokens_per_micro_batch=100_000, cliprange_value=0.5,
                        loss_agg_mode="token-mean")
    return base.model_copy(update=changes)


@pytest.fixture(scope="module")
def critic(tiny_model_dir):
    group = CriticGroup(ModelConfig(path=str(tiny_model_dir)), critic_config(), total_steps=100, use_ray=False)
    yield group
    group.shutdown()


@pytest.fixture
def batch(critic):
    b = episodes_to_batch(ragged_episodes(8), pad_token_id=0)
    b["values"] = critic.compute_values(b)
    b["returns"] = b["loss_mask"] * torch.linspace(-1.0, 1.0, b["loss_mask"].shape[1])
    return b


def full_state(group) -> dict[str, torch.Tensor]:
    return group.full_state_dict()


def optimizer_moments(group) -> list[torch.Tensor]:
    opt = group.workers[0].optimizer
    return [state[key].clone() for p in opt.param_groups[0]["params"] for state in [opt.state[p]]
            for key in ("exp_avg", "exp_avg_sq")]


def test_values_sit_on_token_positions_and_ignore_micro_batching(critic, batch):
    values = batch["values"]
    assert values.shape == batch["input_ids"].shape
    assert float(values[:, 0].abs().sum()) == 0.0  # position 0 has no state before it
    padding = torch.arange(values.shape[1]) >= batch["seq_lens"][:, None]
    assert float(values[padding].abs().sum()) == 0.0 and float(values[~padding].abs().sum()) > 0
    critic.cfg = critic.workers[0].cfg = critic_config(max_tokens_per_micro_batch=48)
    try:
        assert critic._plan(batch, None).num_micro_batches >= 4
        torch.testing.assert_close(critic.compute_values(batch), values, atol=1e-5, rtol=0)
    finally:
        critic.cfg = critic.workers[0].cfg = critic_config()


def test_training_towards_fixed_returns_lowers_the_value_loss(critic, batch):
    first = critic.update_critic(batch, mini_batch_size=8, shuffle=False)
    for key in ("vf_loss", "vf_clipfrac", "vpred_mean", "grad_norm", "lr", "optimizer_steps"):
        assert key in first, key
    assert first["optimizer_steps"] == 1 and first["vf_clipfrac"] == 0.0  # values == old values at the start
    # The update's forward (train mode) is the function compute_values evaluated: no dropout.
    mask = batch["loss_mask"]
    assert first["vpred_mean"] == pytest.approx(float((batch["values"] * mask).sum() / mask.sum()), abs=1e-6)
    for _ in range(5):
        last = critic.update_critic(batch, mini_batch_size=8, shuffle=False)
    assert last["vf_loss"] < first["vf_loss"]
    assert not torch.equal(critic.compute_values(batch), batch["values"])


def test_the_body_starts_from_the_policy_and_the_head_is_seeded(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    policy = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    groups = [CriticGroup(ModelConfig(path=str(tiny_model_dir)), critic_config(), seed=3, use_ray=False)
              for _ in range(2)]
    try:
        a, b = (full_state(g) for g in groups)
    finally:
        for g in groups:
            g.shutdown()
    body = [k for k in a if k.startswith("model.")]
    assert body and all(torch.equal(a[k], policy[k]) for k in body)
    assert a["score.weight"].shape == (1, policy["model.embed_tokens.weight"].shape[1])
    assert torch.equal(a["score.weight"], b["score.weight"])  # same seed, same head


def test_critic_model_path_defaults_to_the_policy():
    policy = ModelConfig(path="runs/policy", dtype="bfloat16")
    assert critic_model(policy, None) is policy
    assert critic_model(policy, "runs/value") == policy.model_copy(update={"path": "runs/value"})


def test_checkpoint_restores_critic_weights_and_optimizer_next_to_the_policy(critic, batch, tiny_model_dir,
                                                                            tmp_path):
    critic.update_critic(batch, mini_batch_size=4, shuffle=False)  # optimizer moments exist
    policy = WorkerGroup(ModelConfig(path=str(tiny_model_dir)), ActorConfig(lr=1e-3), use_ray=False)
    try:
        policy.save_checkpoint(tmp_path)
        critic.save_checkpoint(tmp_path)
        assert (tmp_path / "actor").is_dir() and (tmp_path / "critic").is_dir()
        assert (tmp_path / "worker_rank0.pt").is_file() and (tmp_path / "critic_rank0.pt").is_file()
        saved, moments, lr = full_state(critic), optimizer_moments(critic), critic.workers[0].scheduler.last_epoch
        critic.update_critic(batch, mini_batch_size=4, shuffle=False)
        assert not all(torch.equal(saved[k], v) for k, v in full_state(critic).items())
        critic.load_checkpoint(tmp_path)
        restored = full_state(critic)
        assert all(torch.equal(saved[k], restored[k]) for k in saved)
        assert all(torch.equal(a, b) for a, b in zip(moments, optimizer_moments(critic), strict=True))
        assert critic.workers[0].scheduler.last_epoch == lr
        policy_only = tmp_path / "policy-only"
        policy.save_checkpoint(policy_only)
        with pytest.raises(FileNotFoundError, match="has no critic/"):
            critic.load_checkpoint(policy_only)
    finally:
        policy.shutdown()
