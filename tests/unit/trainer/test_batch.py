"""Episodes -> padded batch, and the micro-batch plan (coverage, balance, token budget, equal counts per rank)."""

from __future__ import annotations

import functools
import operator
import random

import pytest
import torch

from agentrl.trainer.batch import (
    episodes_to_batch,
    materialize,
    mini_batches,
    plan_micro_batches,
    scatter_rows,
    sft_batch,
    take_rows,
)
from agentrl.types import Episode


def make_episode(prompt_len: int, response_len: int, *, uid: str = "g", reward: float = 0.0, seed: int = 0,
                 mask: list[int] | None = None) -> Episode:
    rng = random.Random(seed)
    mask = mask if mask is not None else [1] * response_len
    return Episode(uid=uid, prompt_ids=[rng.randrange(1, 100) for _ in range(prompt_len)],
                   response_ids=[rng.randrange(1, 100) for _ in range(response_len)], response_mask=mask,
                   response_logprobs=[-0.5 if m else 0.0 for m in mask], messages=[], reward=reward,
                   turn_ids=[0 if m else -1 for m in mask])


def test_episodes_to_batch_aligns_response_tokens_after_the_prompt():
    eps = [make_episode(3, 4, mask=[1, 0, 0, 1]), make_episode(2, 2)]
    batch = episodes_to_batch(eps, pad_token_id=0, advantages=[1.5, -1.0])
    assert batch["input_ids"].shape == (2, 7)
    assert batch["seq_lens"].tolist() == [7, 4]
    assert batch["loss_mask"][0].tolist() == [0, 0, 0, 1, 0, 0, 1]
    assert batch["loss_mask"][1].tolist() == [0, 0, 1, 1, 0, 0, 0]
    assert batch["input_ids"][1, 4:].tolist() == [0, 0, 0]
    assert batch["input_ids"][0].tolist() == eps[0].prompt_ids + eps[0].response_ids
    assert batch["rollout_logprobs"][0].tolist() == [0, 0, 0, -0.5, 0, 0, -0.5]
    assert batch["turn_ids"][0].tolist() == [-1, -1, -1, 0, -1, -1, 0]
    # One advantage per episode, spread over its loss tokens only.
    assert batch["advantages"][0].tolist() == [0, 0, 0, 1.5, 0, 0, 1.5]
    assert batch["advantages"][1].tolist() == [0, 0, -1.0, -1.0, 0, 0, 0]


def test_token_rewards_are_kept_on_loss_tokens_only():
    eps = [make_episode(3, 4, mask=[1, 0, 0, 1]), make_episode(2, 2)]
    batch = episodes_to_batch(eps, pad_token_id=0, token_rewards=[[0.5, 9.0, 9.0, 1.0], [0.0, 2.0]])
    assert batch["token_rewards"][0].tolist() == [0, 0, 0, 0.5, 0, 0, 1.0]
    assert batch["token_rewards"][1].tolist() == [0, 0, 0, 2.0, 0, 0, 0]
    with pytest.raises(ValueError, match="3 token rewards for 4 response tokens"):
        episodes_to_batch(eps, pad_token_id=0, token_rewards=[[0.0] * 3, [0.0, 0.0]])


def test_infra_failed_episodes_are_refused():
    ep = make_episode(2, 2)
    ep.infra_error = True
    with pytest.raises(ValueError, match="infra failure"):
        episodes_to_batch([ep], pad_token_id=0)


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_plan_covers_every_row_once_with_equal_micro_batch_counts(world_size):
    rng = random.Random(world_size)
    lens = [rng.randint(16, 512) for _ in range(23)]
    plan = plan_micro_batches(lens, world_size=world_size, max_tokens=1024)
    rows = sorted(i for rank in plan.rows for mb in rank for i in mb)
    assert rows == list(range(23))
    assert len({len(rank) for rank in plan.rows}) == 1
    for rank_rows, rank_w in zip(plan.rows, plan.width):
        for mb, width in zip(rank_rows, rank_w):
            if len(mb) > 1:
                assert len(mb) * width <= 1024  # a row longer than the budget is the only one it may break
            if mb:
                assert width == max(lens[i] for i in mb)
    loads = [sum(lens[i] for mb in rank for i in mb) for rank in plan.rows]
    assert max(loads) - min(loads) <= max(lens)


def test_bucketing_pads_far_less_than_full_padding():
    rng = random.Random(0)
    lens = [rng.randint(16, 512) for _ in range(64)]
    bucket = plan_micro_batches(lens, max_tokens=2048, strategy="bucket")
    full = plan_micro_batches(lens, max_rows=4, strategy="full")
    assert bucket.padded_tokens() < 0.7 * full.padded_tokens()
    assert bucket.padded_tokens() <= 1.3 * sum(lens)


def test_ranks_with_less_work_get_dummy_micro_batches_that_carry_no_loss():
    lens = [30, 5]
    plan = plan_micro_batches(lens, world_size=3, max_tokens=1000)
    assert plan.num_micro_batches == 1
    assert sum(1 for rank in plan.rows if rank[0] == []) == 1
    batch = episodes_to_batch([make_episode(3, 27), make_episode(2, 3)], pad_token_id=0)
    dummy = take_rows(batch, [], 2)
    assert dummy["input_ids"].shape == (1, 2)
    assert float(dummy["loss_mask"].sum()) == 0.0


def test_scatter_rows_inverts_materialize():
    eps = [make_episode(2, n, seed=n) for n in (3, 9, 1, 6, 4)]
    batch = episodes_to_batch(eps, pad_token_id=0)
    plan = plan_micro_batches(batch["seq_lens"].tolist(), world_size=2, max_tokens=16)
    parts = materialize(batch, plan)
    values = [[mb["input_ids"].float() * mb["loss_mask"] for mb in rank] for rank in parts]
    back = scatter_rows(values, plan, *batch["input_ids"].shape)
    assert torch.equal(back, batch["input_ids"].float() * batch["loss_mask"])


def test_mini_batches_are_seeded_permutations_per_epoch():
    steps = mini_batches(10, 4, epochs=2, shuffle=True, seed=3)
    assert [len(s) for s in steps] == [4, 4, 2, 4, 4, 2]
    assert sorted(functools.reduce(operator.iadd, steps[:3], [])) == list(range(10))
    assert steps == mini_batches(10, 4, epochs=2, shuffle=True, seed=3)
    assert mini_batches(5, 5, shuffle=False) == [[0, 1, 2, 3, 4]]


def test_sft_batch_masks_the_first_token_and_padding():
    batch = sft_batch([([5, 6, 7], [1, 1, 1]), ([8, 9], [0, 1])], pad_token_id=0)
    assert batch["loss_mask"].tolist() == [[0, 1, 1], [0, 1, 0]]
