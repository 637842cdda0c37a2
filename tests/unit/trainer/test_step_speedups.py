"""The GRPO step's speed-ups change no result: the LM head only at loss tokens (`actor.fast_logprobs`), a group's
shared prompt run once (`actor.share_prompt_prefix`), pi_old taken from the update's own forward
(`actor.reuse_old_logprobs`), the fused log-prob + entropy pass, weights through shared memory, and CPU sampling on
a thread pool."""

from __future__ import annotations

import os
import random

import pytest
import torch
from test_worker import ragged_episodes

from agentrl.config import load_config
from agentrl.inference import sampling
from agentrl.trainer.algos import (
    entropy_from_logits,
    logprobs_and_entropy_from_logits,
    logprobs_from_logits,
    rollout_is_weights,
)
from agentrl.trainer.batch import episodes_to_batch, split_shared_prefixes
from agentrl.trainer.config import ActorConfig, ModelConfig, TrainConfig
from agentrl.trainer.loop import in_update_correction, reuses_old_logprobs
from agentrl.trainer.weight_sync import SharedStateDict
from agentrl.trainer.worker import WorkerGroup
from agentrl.types import Episode, SamplingParams

ADVANTAGES = [1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 1.0, -1.0]


def make_group_actor() -> ActorConfig:
    return ActorConfig(lr=1e-3, use_kl_loss=True, kl_loss_coef=0.1, entropy_coeff=0.0, grad_clip=1.0,
                       max_tokens_per_micro_batch=100_000, warmup_steps=0, clip_ratio_high=0.28)


def make_group(model_dir, **actor_changes) -> WorkerGroup:
    actor = make_group_actor().model_copy(update=actor_changes)
    return WorkerGroup(ModelConfig(path=str(model_dir)), actor, with_ref=True, total_steps=10, use_ray=False)


@pytest.fixture(scope="module")
def groups(tiny_model_dir):
    fast, full = make_group(tiny_model_dir), make_group(tiny_model_dir, fast_logprobs=False)
    yield fast, full
    fast.shutdown()
    full.shutdown()


def fresh_batch():
    return episodes_to_batch(ragged_episodes(8), pad_token_id=0, advantages=ADVANTAGES)


def set_actor(group, **changes):
    group.cfg = group.workers[0].cfg = group.cfg.model_copy(update=changes)


def test_fast_logprobs_equal_the_full_head_on_loss_tokens(groups):
    fast, full = groups
    batch = fresh_batch()
    mask = batch["loss_mask"].bool()
    logp_fast, ent_fast = fast.compute_logprobs(batch, temperature=0.9, with_entropy=True)
    logp_full, ent_full = full.compute_logprobs(batch, temperature=0.9, with_entropy=True)
    torch.testing.assert_close(logp_fast[mask], logp_full[mask], atol=1e-6, rtol=0)
    torch.testing.assert_close(ent_fast[mask], ent_full[mask], atol=2e-5, rtol=0)
    assert float(logp_fast[~mask].abs().sum()) == 0.0  # prompt, observations and padding are not computed
    assert float(logp_full[mask].abs().sum()) > 0


@pytest.mark.parametrize("entropy_coeff", [0.0, 0.01])
def test_fast_logprobs_give_the_same_gradient(groups, entropy_coeff):
    fast, full = groups
    batch = fresh_batch()
    batch["old_logprobs"], _ = full.compute_logprobs(batch, temperature=0.9)
    batch["ref_logprobs"], _ = full.compute_logprobs(batch, temperature=0.9, ref=True)
    for g in groups:
        set_actor(g, entropy_coeff=entropy_coeff, max_tokens_per_micro_batch=48)  # several micro-batches
    try:
        a, b = fast.gradients(batch, temperature=0.9), full.gradients(batch, temperature=0.9)
    finally:
        for g in groups:
            set_actor(g, entropy_coeff=0.0, max_tokens_per_micro_batch=100_000)
    assert sum(float(v.abs().sum()) for v in a.values()) > 0
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=1e-6, rtol=1e-5, msg=name)


def grouped_episodes() -> list[Episode]:
    """GRPO-like rows: groups that share a prompt (3, 4 and 1 rows), multi-turn responses whose observation
    tokens carry no loss, a row whose first response tokens are not the policy's (template glue), and a row with
    no loss token at all (as after algorithm.mask_truncated)."""
    rng = random.Random(3)
    eps = []
    for g, size in enumerate((3, 4, 1)):
        prompt = [rng.randrange(3, 2000) for _ in range(rng.randint(5, 12))]
        for k in range(size):
            r = rng.randint(6, 30)
            mask = [1 if (j // 5) % 2 == 0 else 0 for j in range(r)]  # policy turns between observations
            if g == 1 and k == 2:
                mask[:2] = [0, 0]  # its loss starts later: a longer prefix of its own
            if g == 1 and k == 3:
                mask = [0] * r
            eps.append(Episode(uid=f"g{g}", prompt_ids=list(prompt),
                               response_ids=[rng.randrange(3, 2000) for _ in range(r)], response_mask=mask,
                               response_logprobs=[-7.0 * m for m in mask], messages=[], reward=float(k % 2)))
    return eps


def grouped_batch():
    return episodes_to_batch(grouped_episodes(), pad_token_id=0, advantages=ADVANTAGES)


def test_split_shared_prefixes_runs_each_prompt_once():
    batch = grouped_batch()
    target = batch["loss_mask"].bool()
    split = split_shared_prefixes(batch["input_ids"], target, batch["seq_lens"])
    prompts = [len(ep.prompt_ids) for ep in grouped_episodes()]
    # groups 0 and 1 share their prompts (but row 5 starts two tokens later, row 6 has no loss token: whole row)
    assert split.group_B.tolist() == [0, 0, 0, 1, 1, 2, 3, 4]
    assert split.starts_B.tolist() == prompts[:5] + [prompts[5] + 2, int(batch["seq_lens"][6]), prompts[7]]
    assert split.saved_tokens == 2 * prompts[0] + prompts[3]
    for i in range(8):
        start, end = int(split.starts_B[i]), int(batch["seq_lens"][i])
        assert split.suffix_ids_B_S[i, : end - start].tolist() == batch["input_ids"][i, start:end].tolist()
        prefix = split.prefix_ids_U_P[split.group_B[i], :start]
        assert prefix.tolist() == batch["input_ids"][i, :start].tolist()
    distinct = fresh_batch()  # every row its own prompt: nothing to share
    assert split_shared_prefixes(distinct["input_ids"], distinct["loss_mask"].bool(), distinct["seq_lens"]) is None


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_shared_prompt_prefix_gives_the_same_logprobs_and_gradient(tiny_model_dir, attn):
    shared, whole = (WorkerGroup(ModelConfig(path=str(tiny_model_dir), attn_implementation=attn),
                                 make_group_actor().model_copy(update={"share_prompt_prefix": flag}), with_ref=True,
                                 total_steps=10, use_ray=False) for flag in (True, False))
    try:
        batch = grouped_batch()
        mask = batch["loss_mask"].bool()
        for ref in (False, True):
            logp_s, ent_s = shared.compute_logprobs(batch, temperature=0.9, with_entropy=True, ref=ref)
            logp_w, ent_w = whole.compute_logprobs(batch, temperature=0.9, with_entropy=True, ref=ref)
            torch.testing.assert_close(logp_s, logp_w, atol=2e-6, rtol=0)
            torch.testing.assert_close(ent_s[mask], ent_w[mask], atol=2e-5, rtol=0)
        assert float(logp_s[mask].abs().min()) > 0 and float(logp_s[~mask].abs().sum()) == 0.0
        batch["old_logprobs"], batch["ref_logprobs"] = logp_w, logp_w + 0.01 * mask
        for entropy_coeff, micro_tokens in ((0.0, 100_000), (0.01, 100_000), (0.0, 96)):  # 96: several micro-batches
            for g in (shared, whole):
                set_actor(g, entropy_coeff=entropy_coeff, max_tokens_per_micro_batch=micro_tokens)
            a, b = shared.gradients(batch, temperature=0.9), whole.gradients(batch, temperature=0.9)
            assert sum(float(v.abs().sum()) for v in a.values()) > 0
            for name in a:
                torch.testing.assert_close(a[name], b[name], atol=1e-6, rtol=1e-5, msg=f"{name} {entropy_coeff}")
    finally:
        shared.shutdown()
        whole.shutdown()


def test_shared_prompt_prefix_is_off_where_it_cannot_work(tiny_model_dir):
    group = make_group(tiny_model_dir)
    worker = group.workers[0]
    try:
        assert worker._shares_prefixes()
        for changes in ({"share_prompt_prefix": False}, {"fast_logprobs": False}):
            worker.cfg = worker.cfg.model_copy(update=changes)
            assert not worker._shares_prefixes(), changes
            worker.cfg = worker.cfg.model_copy(update={"share_prompt_prefix": True, "fast_logprobs": True})
        for changes in ({"attn_implementation": "flash_attention_2"}, {"gradient_checkpointing": True}):
            saved, worker.model_cfg = worker.model_cfg, worker.model_cfg.model_copy(update=changes)
            assert not worker._shares_prefixes(), changes
            worker.model_cfg = saved
        config = worker.model.config
        saved_types, config.layer_types = config.layer_types, ["full_attention", "sliding_attention"]
        assert not worker._shares_prefixes()
        config.layer_types = saved_types
    finally:
        group.shutdown()


def separate_and_reused_batches(separate: WorkerGroup, reused: WorkerGroup) -> tuple:
    """The same batch twice, each with its group's reference logprobs; the first with pi_old from a separate
    pass, the second without (the update computes it)."""
    a, b = fresh_batch(), fresh_batch()
    for g, batch in ((separate, a), (reused, b)):
        batch["ref_logprobs"], _ = g.compute_logprobs(batch, temperature=0.9, ref=True)
    a["old_logprobs"], _ = separate.compute_logprobs(a, temperature=0.9)
    return a, b


@pytest.mark.parametrize("mini_batch_size", [8, 4])  # one optimizer step, and two
def test_reused_old_logprobs_give_the_same_update(tiny_model_dir, mini_batch_size):
    separate, reused = make_group(tiny_model_dir), make_group(tiny_model_dir)
    try:
        a, b = separate_and_reused_batches(separate, reused)
        m_a = separate.update_policy(a, temperature=0.9, mini_batch_size=mini_batch_size, seed=3)
        assert "old_logprobs" not in b.keys()
        m_b = reused.update_policy(b, temperature=0.9, mini_batch_size=mini_batch_size, seed=3,
                                   reuse_old_logprobs=True)
        mask = a["loss_mask"].bool()
        torch.testing.assert_close(b["old_logprobs"][mask], a["old_logprobs"][mask], atol=1e-6, rtol=0)
        assert m_a["optimizer_steps"] == m_b["optimizer_steps"] == 8 // mini_batch_size
        for name in ("pg_loss", "kl_loss", "grad_norm", "pg_clipfrac", "entropy"):
            assert m_b[name] == pytest.approx(m_a[name], rel=1e-5, abs=1e-7), name
        assert m_b["ppo_kl"] == pytest.approx(m_a["ppo_kl"], abs=1e-6)
        wa, wb = separate.full_state_dict(), reused.full_state_dict()
        for name in wa:
            torch.testing.assert_close(wb[name], wa[name], atol=1e-6, rtol=1e-5, msg=name)
    finally:
        separate.shutdown()
        reused.shutdown()


def test_reuse_needs_one_epoch_and_falls_back_with_dropout(groups):
    fast, _ = groups
    batch = fresh_batch()
    batch["ref_logprobs"], _ = fast.compute_logprobs(batch, temperature=0.9, ref=True)
    with pytest.raises(ValueError, match="epochs == 1"):
        fast.update_policy(batch, temperature=0.9, mini_batch_size=8, epochs=2, reuse_old_logprobs=True)
    expected, _ = fast.compute_logprobs(batch, temperature=0.9)
    worker = fast.workers[0]
    worker._reuse_is_exact = lambda: False  # as with dropout: every mini-batch gets a separate no-grad pass
    try:
        fast.update_policy(batch, temperature=0.9, mini_batch_size=8, reuse_old_logprobs=True)
    finally:
        del worker._reuse_is_exact
    torch.testing.assert_close(batch["old_logprobs"], expected, atol=1e-6, rtol=0)


def test_reuse_is_used_only_when_nothing_needs_pi_old_before_the_update():
    base = {"model": {"path": "m"}, "data": {"train_files": ["t.jsonl"]}}
    assert reuses_old_logprobs(load_config(TrainConfig, data=base))
    assert in_update_correction(load_config(TrainConfig, data=base)) is None
    for override in ("actor.ppo_epochs=2", "actor.reuse_old_logprobs=false", "algorithm.use_kl_in_reward=true",
                     "algorithm.rollout_correction.level=sequence", "algorithm.rollout_correction.bypass_mode=true",
                     "algorithm.rollout_correction.rejection={level: token, lower: 0.5, upper: 2.0}"):
        cfg = load_config(TrainConfig, data=base, overrides=[override])
        assert not reuses_old_logprobs(cfg) and in_update_correction(cfg) is None, override
    # Token-level weights need only each token's pi_old: the update computes them from its own.
    tis = load_config(TrainConfig, data=base, overrides=["algorithm.rollout_correction.level=token"])
    icepop = load_config(TrainConfig, data=base, overrides=["algorithm.rollout_correction.level=token",
                                                            "algorithm.rollout_correction.mode=mask"])
    assert reuses_old_logprobs(tis) and in_update_correction(tis) == ("token", 2.0, "truncate")
    assert in_update_correction(icepop) == ("token", (0.5, 2.0), "mask")


@pytest.mark.parametrize("threshold, mode", [(2.0, "truncate"), ((0.8, 1.25), "mask")])  # TIS, IcePop
def test_token_correction_inside_the_update_equals_weights_from_a_separate_pass(tiny_model_dir, threshold, mode):
    separate, reused = make_group(tiny_model_dir), make_group(tiny_model_dir)
    try:
        a, b = separate_and_reused_batches(separate, reused)
        mask = a["loss_mask"].bool()
        shift = torch.linspace(-1.0, 1.0, mask.numel()).reshape(mask.shape)  # stale samplers: ratios 1/e..e
        for batch in (a, b):
            batch["rollout_logprobs"] = (a["old_logprobs"] + shift) * a["loss_mask"]
        a["rollout_is_weights"], stats = rollout_is_weights(a["old_logprobs"] - a["rollout_logprobs"], a["loss_mask"],
                                                            "token", threshold, mode=mode)
        assert 0 < stats["rollout_corr/corrected_frac"] < 1  # some weights truncated or masked, some not
        m_a = separate.update_policy(a, temperature=0.9, mini_batch_size=4, seed=3)
        m_b = reused.update_policy(b, temperature=0.9, mini_batch_size=4, seed=3, reuse_old_logprobs=True,
                                   is_correction=("token", threshold, mode))
        for name in ("pg_loss", "kl_loss", "grad_norm", "pg_clipfrac"):
            assert m_b[name] == pytest.approx(m_a[name], rel=1e-5, abs=1e-7), name
        wa, wb = separate.full_state_dict(), reused.full_state_dict()
        for name in wa:
            torch.testing.assert_close(wb[name], wa[name], atol=1e-6, rtol=1e-5, msg=name)
        with pytest.raises(ValueError, match="per token"):
            reused.update_policy(fresh_batch(), temperature=0.9, mini_batch_size=8, reuse_old_logprobs=True,
                                 is_correction=("sequence", threshold, mode))
    finally:
        separate.shutdown()
        reused.shutdown()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_fused_logprobs_and_entropy_match_the_separate_passes(temperature, dtype):
    torch.manual_seed(0)
    logits = (torch.randn(3, 5, 41) * 3).to(dtype).requires_grad_()
    labels = torch.randint(0, 41, (3, 5))
    logp, entropy = logprobs_and_entropy_from_logits(logits, labels, temperature, max_chunk_elements=90)
    ref_logp = logprobs_from_logits(logits, labels, temperature, max_chunk_elements=90)
    weights = torch.randn(3, 5)
    grad, = torch.autograd.grad((logp * weights).sum(), logits)
    ref_grad, = torch.autograd.grad((ref_logp * weights).sum(), logits)
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(logp, ref_logp, atol=tol, rtol=0)
    torch.testing.assert_close(entropy, entropy_from_logits(logits.detach(), temperature), atol=tol, rtol=0)
    torch.testing.assert_close(grad.float(), ref_grad.float(), atol=tol, rtol=0)
    assert not entropy.requires_grad
    x = torch.randn(4, 11, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, 11, (4,))
    assert torch.autograd.gradcheck(
        lambda z: logprobs_and_entropy_from_logits(z, y, 0.8, max_chunk_elements=22)[0], (x,))


def test_shared_state_dict_round_trip_keeps_tied_tensors_once():
    embed = torch.randn(50, 8)
    sd = {"model.embed_tokens.weight": embed, "model.norm.weight": torch.ones(8, dtype=torch.bfloat16),
          "lm_head.weight": embed, "scale": torch.tensor(3.0, dtype=torch.float64)}
    writer = SharedStateDict.create(sd)
    try:
        writer.write(sd)
        reader = SharedStateDict.attach(*writer.handle())
        assert not os.path.exists(writer.path)  # unlinked once both sides hold the mapping
        views = reader.views()
        assert list(views) == list(sd)
        for name, tensor in sd.items():
            assert views[name].dtype == tensor.dtype and torch.equal(views[name], tensor), name
        assert views["lm_head.weight"].data_ptr() == views["model.embed_tokens.weight"].data_ptr()
        assert writer.nbytes < 2 * embed.numel() * 4  # the tied embedding is stored once
        sd["model.embed_tokens.weight"].add_(1.0)
        writer.write(sd)
        assert torch.equal(reader.views()["lm_head.weight"], embed)  # the reader sees the next write
        assert writer.matches(sd) and not writer.matches({"x": embed})
        reader.close()
    finally:
        writer.close()


def test_a_seeded_row_draws_the_same_tokens_alone_or_in_any_batch():
    torch.manual_seed(0)
    logits = torch.randn(6, 20_000) * 4  # a production-sized vocabulary
    params = [SamplingParams(max_new_tokens=1, temperature=t, top_k=k, top_p=p)
              for t, k, p in ((1.0, -1, 1.0), (0.7, -1, 1.0), (0.0, -1, 1.0), (1.0, 50, 1.0), (1.0, -1, 0.9),
                              (1.3, -1, 1.0))]

    def gens():
        return [None if p.temperature <= 0 else sampling.make_generator(100 + i) for i, p in enumerate(params)]

    batched = [sampling.sample_batch(logits, params, g) for g in [gens()] for _ in range(3)]
    alone = [[sampling.sample_batch(logits[i:i + 1], [params[i]], [g[i]]) for _ in range(3)]
             for g in [gens()] for i in range(len(params))]
    for k in range(3):
        assert batched[k][0] == [alone[i][k][0][0] for i in range(len(params))]
        assert batched[k][1] == pytest.approx([alone[i][k][1][0] for i in range(len(params))], abs=1e-6)
    assert len({tuple(b[0]) for b in batched}) > 1  # each draw advances the rows' generators


def test_rank_stages_its_weights_in_shared_memory_or_declines_without_room(groups, monkeypatch):
    fast, _ = groups
    worker = fast.workers[0]
    full = fast.full_state_dict()
    handle = worker.stage_full_state_dict()
    reader = SharedStateDict.attach(*handle)
    try:
        for name, tensor in full.items():
            assert torch.equal(reader.views()[name], tensor), name
    finally:
        reader.close()
        worker._shared_weights.close()
        worker._shared_weights = None
    monkeypatch.setattr(SharedStateDict, "fits", classmethod(lambda cls, nbytes: False))  # a 64 MB /dev/shm
    assert worker.stage_full_state_dict() is None and worker._shared_weights is None
