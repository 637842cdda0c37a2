"""FSDP2 over gloo with Ray actors: two ranks compute the same gradient and the same update as one rank, for
the policy and for the critic."""

from __future__ import annotations

import random

import pytest
import torch

from agentrl.trainer.batch import episodes_to_batch
from agentrl.trainer.config import ActorConfig, CriticConfig, ModelConfig
from agentrl.trainer.critic import CriticGroup
from agentrl.trainer.worker import WorkerGroup
from agentrl.types import Episode

pytestmark = pytest.mark.slow


def episodes(count: int, shared_prompts: bool = False) -> list[Episode]:
    """`shared_prompts`: each group of 3 has one prompt (as in GRPO), which actor.share_prompt_prefix runs once."""
    rng = random.Random(7)
    out, prompt = [], []
    for i in range(count):
        p, r = rng.randint(3, 10), rng.randint(3, 30)
        mask = [int(rng.random() < 0.8) for _ in range(r)]
        if shared_prompts:
            mask[0] = 1  # the loss starts right after the prompt: rows of a group share exactly the prompt
        if not shared_prompts or i % 3 == 0:
            prompt = [rng.randrange(3, 2000) for _ in range(p)]
        out.append(Episode(uid=f"g{i // 3}", prompt_ids=list(prompt),
                           response_ids=[rng.randrange(3, 2000) for _ in range(r)], response_mask=mask,
                           response_logprobs=[-7.0 * m for m in mask], messages=[], reward=float(i % 3 == 0)))
    return out


@pytest.mark.parametrize("shared_prompts", [False, True])
def test_one_and_two_ranks_agree(ray_session, tiny_model_dir, shared_prompts):
    """With shared prompts, one rank runs each row whole and two ranks run a prompt once per micro-batch (one
    micro-batch per rank, and of 7 rows in 3 groups the rank with 4 rows holds two of one group): the same
    gradient and update."""
    model = ModelConfig(path=str(tiny_model_dir))
    batch = episodes_to_batch(episodes(7, shared_prompts), pad_token_id=0,  # odd count: one rank gets an extra row
                              advantages=[1.0, -0.5, -0.5, 2.0, -1.0, -1.0, 0.3])
    results = {}
    for world in (1, 2):
        actor = ActorConfig(lr=1e-3, world_size=world, use_kl_loss=True, kl_loss_coef=0.1, entropy_coeff=0.01,
                            max_tokens_per_micro_batch=100_000 if shared_prompts and world == 2 else 64, grad_clip=1e6,
                            share_prompt_prefix=world == 2 or not shared_prompts)
        group = WorkerGroup(model, actor, with_ref=True, total_steps=10, seed=0)
        try:
            old, _ = group.compute_logprobs(batch, temperature=1.0)
            step_batch = batch.clone()
            step_batch["old_logprobs"], step_batch["ref_logprobs"] = old, old.clone()
            grads = group.gradients(step_batch, temperature=1.0)
            metrics = group.update_policy(step_batch, temperature=1.0, mini_batch_size=7, shuffle=False)
            results[world] = (old, grads, metrics, group.full_state_dict())
        finally:
            group.shutdown()
    (old1, g1, m1, w1), (old2, g2, m2, w2) = results[1], results[2]
    torch.testing.assert_close(old2, old1, atol=1e-5, rtol=0)
    assert sum(float(g.abs().sum()) for g in g1.values()) > 0
    for name in g1:
        torch.testing.assert_close(g2[name], g1[name], atol=1e-5, rtol=1e-4, msg=name)
    for key in ("pg_loss", "kl_loss", "entropy", "grad_norm", "pg_clipfrac"):
        assert m2[key] == pytest.approx(m1[key], abs=1e-5), key
    for name in w1:
        torch.testing.assert_close(w2[name], w1[name], atol=1e-5, rtol=1e-4, msg=name)


def test_one_and_two_critic_ranks_agree(ray_session, tiny_model_dir):
    model = ModelConfig(path=str(tiny_model_dir))
    batch = episodes_to_batch(episodes(7), pad_token_id=0)
    results = {}
    for world in (1, 2):
        critic = CriticGroup(model, CriticConfig(lr=1e-3, world_size=world, max_tokens_per_micro_batch=64,
                                                 grad_clip=1e6, loss_agg_mode="token-mean"), total_steps=10, seed=0)
        try:
            step_batch = batch.clone()
            step_batch["values"] = critic.compute_values(step_batch)
            step_batch["returns"] = step_batch["loss_mask"] * 0.5
            metrics = critic.update_critic(step_batch, mini_batch_size=7, shuffle=False)
            results[world] = (step_batch["values"], metrics, critic.full_state_dict())
        finally:
            critic.shutdown()
    (v1, m1, w1), (v2, m2, w2) = results[1], results[2]
    torch.testing.assert_close(v2, v1, atol=1e-5, rtol=0)
    for key in ("vf_loss", "vf_clipfrac", "vpred_mean", "grad_norm"):
        assert m2[key] == pytest.approx(m1[key], abs=1e-5), key
    for name in w1:
        torch.testing.assert_close(w2[name], w1[name], atol=1e-5, rtol=1e-4, msg=name)


def test_reused_old_logprobs_and_shared_memory_weights_over_two_ranks(ray_session, tiny_model_dir):
    """Two Ray ranks taking pi_old from the update itself (two mini-batches: the second gets its no-grad pass
    before the first step) make the same update as with a separate pi_old pass; the engine's weights come
    through rank 0's shared-memory file and equal the gathered state dict; no shared file outlives the group."""
    import glob

    model = ModelConfig(path=str(tiny_model_dir))
    batch = episodes_to_batch(episodes(7), pad_token_id=0, advantages=[1.0, -0.5, -0.5, 2.0, -1.0, -1.0, 0.3])
    shared_before = set(glob.glob("/dev/shm/agentrl-weights-*"))
    results = {}
    for reuse in (False, True):
        actor = ActorConfig(lr=1e-3, world_size=2, use_kl_loss=True, kl_loss_coef=0.1,
                            max_tokens_per_micro_batch=64, grad_clip=1e6)
        group = WorkerGroup(model, actor, with_ref=True, total_steps=10, seed=0)
        try:
            step_batch = batch.clone()
            step_batch["ref_logprobs"], _ = group.compute_logprobs(step_batch, temperature=1.0, ref=True)
            if not reuse:
                step_batch["old_logprobs"], _ = group.compute_logprobs(step_batch, temperature=1.0)
            metrics = group.update_policy(step_batch, temperature=1.0, mini_batch_size=4, shuffle=False,
                                          reuse_old_logprobs=reuse)
            full = group.full_state_dict()
            engine = group.engine_state_dict()
            assert list(engine) == list(full)
            for name in full:
                assert torch.equal(engine[name], full[name]), name
            results[reuse] = (step_batch["old_logprobs"], metrics, full)
        finally:
            group.shutdown()
    (old1, m1, w1), (old2, m2, w2) = results[False], results[True]
    mask = batch["loss_mask"].bool()
    torch.testing.assert_close(old2[mask], old1[mask], atol=1e-6, rtol=0)
    for name in ("pg_loss", "kl_loss", "grad_norm", "ppo_kl"):
        assert m2[name] == pytest.approx(m1[name], rel=1e-4, abs=1e-6), name
    for name in w1:
        torch.testing.assert_close(w2[name], w1[name], atol=1e-5, rtol=1e-4, msg=name)
    assert set(glob.glob("/dev/shm/agentrl-weights-*")) <= shared_before
