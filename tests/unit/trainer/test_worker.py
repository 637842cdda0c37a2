"""The FSDP2 policy worker in-process (one gloo rank): loss goes down, micro-batching does not change the
gradient, masked tokens get none, a non-finite gradient skips the step, checkpoints round-trip."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from agentrl.trainer.batch import episodes_to_batch, sft_batch
from agentrl.trainer.config import ActorConfig, ModelConfig
from agentrl.trainer.worker import WorkerGroup, lr_factor
from agentrl.types import Episode


def ragged_episodes(count: int, seed: int = 0) -> list[Episode]:
    rng = random.Random(seed)
    eps = []
    for i in range(count):
        p, r = rng.randint(3, 8), rng.randint(4, 24)
        mask = [1 if rng.random() < 0.7 else 0 for _ in range(r)]
        mask[0] = 1
        eps.append(Episode(uid=f"g{i // 2}", prompt_ids=[rng.randrange(3, 2000) for _ in range(p)],
                           response_ids=[rng.randrange(3, 2000) for _ in range(r)], response_mask=mask,
                           response_logprobs=[-7.0 * m for m in mask], messages=[], reward=float(i % 2)))
    return eps


@pytest.fixture(scope="module")
def group(tiny_model_dir):
    actor = ActorConfig(lr=1e-3, use_kl_loss=True, kl_loss_coef=0.1, entropy_coeff=0.01, grad_clip=1e6,
                        max_tokens_per_micro_batch=100_000, warmup_steps=0)
    wg = WorkerGroup(ModelConfig(path=str(tiny_model_dir)), actor, with_ref=True, total_steps=100, use_ray=False)
    yield wg
    wg.shutdown()


@pytest.fixture
def batch(group):
    eps = ragged_episodes(8)
    b = episodes_to_batch(eps, pad_token_id=0, advantages=[1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 1.0, -1.0])
    b["old_logprobs"], _ = group.compute_logprobs(b, temperature=0.9)
    b["ref_logprobs"], _ = group.compute_logprobs(b, temperature=0.9, ref=True)
    return b


def with_budget(group, **changes):
    """Change actor knobs for the driver's planning and the in-process rank's loss."""
    group.cfg = group.workers[0].cfg = group.cfg.model_copy(update=changes)


def test_logprobs_do_not_depend_on_padding_or_micro_batching(group, batch):
    with_budget(group, max_tokens_per_micro_batch=64)
    small, _ = group.compute_logprobs(batch, temperature=0.9)
    with_budget(group, max_tokens_per_micro_batch=100_000)
    torch.testing.assert_close(small, batch["old_logprobs"], atol=1e-5, rtol=0)
    assert float(batch["old_logprobs"][:, 0].abs().sum()) == 0.0
    assert torch.allclose(batch["old_logprobs"], batch["ref_logprobs"])  # no update yet: policy == reference


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_one_vs_many_micro_batches_give_the_same_gradient(group, batch, mode):
    with_budget(group, loss_agg_mode=mode, max_tokens_per_micro_batch=100_000)
    one = group.gradients(batch, temperature=0.9)
    with_budget(group, max_tokens_per_micro_batch=32)
    plan = group._plan(batch, None)
    assert plan.num_micro_batches >= 4
    many = group.gradients(batch, temperature=0.9)
    with_budget(group, loss_agg_mode="token-mean", max_tokens_per_micro_batch=100_000)
    assert sum(float(g.abs().sum()) for g in one.values()) > 0
    for name in one:
        torch.testing.assert_close(many[name], one[name], atol=1e-5, rtol=1e-4, msg=name)


def test_masked_tokens_get_no_gradient(group, batch):
    base = group.gradients(batch, temperature=0.9)
    poisoned = batch.clone()
    off = poisoned["loss_mask"] == 0
    poisoned["old_logprobs"][off] = 50.0  # garbage where the mask is 0 must not matter
    poisoned["ref_logprobs"][off] = -50.0
    for name, g in group.gradients(poisoned, temperature=0.9).items():
        torch.testing.assert_close(g, base[name], atol=1e-6, rtol=0, msg=name)
    silent = batch.clone()
    silent["loss_mask"] = torch.zeros_like(silent["loss_mask"])
    assert all(float(g.abs().max()) == 0.0 for g in group.gradients(silent, temperature=0.9).values())


def test_repeated_updates_on_a_fixed_batch_lower_the_loss(group, batch):
    with_budget(group, clip_ratio_high=5.0, clip_ratio_low=0.9, kl_loss_coef=0.0, entropy_coeff=0.0)
    before = group.full_state_dict()
    losses = [group.update_policy(batch, temperature=0.9, mini_batch_size=8)["pg_loss"] for _ in range(4)]
    with_budget(group, clip_ratio_high=0.2, clip_ratio_low=0.2, kl_loss_coef=0.1, entropy_coeff=0.01)
    assert losses[-1] < losses[0] - 0.05, losses
    after = group.full_state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_non_finite_gradient_skips_the_step_and_is_counted(group, batch):
    bad = batch.clone()
    bad["advantages"] = torch.full_like(bad["advantages"], float("inf"))
    before = group.full_state_dict()
    metrics = group.update_policy(bad, temperature=0.9, mini_batch_size=8)
    assert metrics["skipped_steps"] == 1.0
    after = group.full_state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_sft_update_lowers_the_masked_nll(group):
    rng = random.Random(1)
    seqs = []
    for _ in range(4):
        ids = [rng.randrange(3, 2000) for _ in range(24)]
        seqs.append((ids, [0] * 8 + [1] * 16))
    batch = sft_batch(seqs, pad_token_id=0)
    losses = [group.update_sft(batch)["sft_loss"] for _ in range(5)]
    assert losses[-1] < losses[0] * 0.9, losses


def test_checkpoint_round_trip_restores_weights_and_schedule(group, batch, tmp_path):
    group.save_checkpoint(tmp_path)
    saved = group.full_state_dict()
    lr_saved = group.workers[0].optimizer.param_groups[0]["lr"]
    group.update_policy(batch, temperature=0.9, mini_batch_size=4)
    group.load_checkpoint(tmp_path)
    restored = group.full_state_dict()
    assert all(torch.equal(saved[k], restored[k]) for k in saved)
    assert group.workers[0].optimizer.param_groups[0]["lr"] == lr_saved


def test_lr_schedule_warms_up_then_decays():
    f = {"warmup_steps": 2, "total_steps": 10, "min_lr_ratio": 0.1}
    assert [lr_factor(s, schedule="constant", **f) for s in (0, 1, 5)] == [0.5, 1.0, 1.0]
    cos = [lr_factor(s, schedule="cosine", **f) for s in range(12)]
    assert cos[:2] == [0.5, 1.0] and cos[2] == 1.0
    assert all(a >= b for a, b in itertools.pairwise(cos[2:]))
    assert abs(cos[10] - 0.1) < 1e-9 and abs(cos[11] - 0.1) < 1e-9


def test_gradient_checkpointing_gives_the_same_gradient(group, batch, tiny_model_dir):
    # Fresh weights for both (the module's group has been trained); both join the existing 1-rank process group.
    plain, checkpointed = (WorkerGroup(ModelConfig(path=str(tiny_model_dir), gradient_checkpointing=flag),
                                       group.actor, with_ref=True, total_steps=100, use_ray=False)
                           for flag in (False, True))
    try:
        assert checkpointed.workers[0].model.model.layers[0].gradient_checkpointing
        want = plain.gradients(batch, temperature=0.9)
        got = checkpointed.gradients(batch, temperature=0.9)
    finally:
        plain.shutdown()
        checkpointed.shutdown()
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=1e-6, rtol=1e-5, msg=name)


def test_resume_with_more_total_steps_continues_on_the_longer_schedule(group, tiny_model_dir, tmp_path):
    # 3 cosine steps end at lr 0; resumed with total_steps=5 the 4th step uses the 5-step schedule's lr at step 3.
    actor = group.actor.model_copy(update=dict(lr=1e-3, lr_schedule="cosine", warmup_steps=0, min_lr_ratio=0.0))
    rng = random.Random(2)
    batch = sft_batch([([rng.randrange(3, 2000) for _ in range(12)], [0] * 4 + [1] * 8) for _ in range(2)], 0)
    model = ModelConfig(path=str(tiny_model_dir))
    short = WorkerGroup(model, actor, total_steps=3, use_ray=False)
    assert [short.update_sft(batch)["lr"] for _ in range(3)] == pytest.approx([1e-3, 7.5e-4, 2.5e-4])
    short.save_checkpoint(tmp_path)
    short.shutdown()
    schedule = {"warmup_steps": 0, "schedule": "cosine", "min_lr_ratio": 0.0}
    for total in (3, 5):
        resumed = WorkerGroup(model, actor, total_steps=total, use_ray=False)
        resumed.load_checkpoint(tmp_path)
        lr = resumed.update_sft(batch)["lr"]
        resumed.shutdown()
        assert lr == 1e-3 * lr_factor(3, total_steps=total, **schedule)
    assert lr > 0.3e-3
