"""Episodes -> a padded TensorDict, and the micro-batch plan that keeps padding small and ranks balanced.

Layout: one row per trajectory, `prompt_ids + response_ids` right-padded to the longest row. Every per-token
tensor is aligned with `input_ids`: the value at position p belongs to token p (its logprob is read from the
logits at p - 1), so position 0 is always a prompt token and never carries loss.

    input_ids_B_L         int64   prompt + response ids, pad_token_id after seq_len
    seq_lens_B            int64   real tokens per row
    loss_mask_B_L         float32 1 on tokens the policy sampled (Episode.response_mask), 0 on prompt,
                                  tool observations, template glue and padding
    rollout_logprobs_B_L  float32 engine logprobs on loss tokens, 0 elsewhere
    turn_ids_B_L          int64   assistant-turn index of each loss token, -1 elsewhere
    weight_versions_B_L   int64   weight version that sampled each loss token (Episode.response_versions), -1
                                  elsewhere and on every token of an episode without recorded versions
    advantages_B_L        float32 advantage of each loss token (0 elsewhere); the loop sets it from the estimator
    rewards_B             float32 the episode's score
    token_rewards_B_L     float32 optional: per-token rewards (e.g. per turn) on loss tokens, added to the
                                  score the loop puts on the last loss token
The loop adds, before the update: old_logprobs_B_L, ref_logprobs_B_L, values_B_L and returns_B_L (critic),
rollout_is_weights_B_L (rollout correction), all aligned with input_ids like the rest.

Padding strategy ("bucket"): inside a mini-batch, rows are spread over ranks by token count (longest first,
to the least-loaded rank), each rank sorts its rows by length and cuts them into micro-batches whose padded
size (rows x longest row) stays under `max_tokens_per_micro_batch`, and every micro-batch is trimmed to its own
longest row. "full" is the naive baseline (fixed row count, padded to the batch's longest row), kept for the
benchmark. Every rank gets the same number of micro-batches (FSDP collectives must match); a rank with less
work gets an all-masked two-token dummy micro-batch, which adds exactly zero gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDict

from agentrl.types import Episode

TOKEN_KEYS = ("input_ids", "loss_mask", "rollout_logprobs", "turn_ids", "weight_versions", "old_logprobs",
              "ref_logprobs", "advantages", "token_rewards", "values", "returns", "rollout_is_weights")


def episodes_to_batch(episodes: list[Episode], pad_token_id: int, advantages: list[float] | None = None, *,
                      token_rewards: list[list[float]] | None = None) -> TensorDict:
    """Stack `episodes` into the padded layout above (see the module docstring for keys and shapes).

    `advantages`: one per episode, broadcast over its loss tokens (default 0: the loop sets them later).
    `token_rewards`: per episode, one reward per response token (len(response_ids)); kept on loss tokens only.
    """
    if not episodes:
        raise ValueError("episodes_to_batch got no episodes: every episode of the step was filtered out")
    for ep in episodes:
        ep.check()
        if ep.infra_error:
            raise ValueError(f"episode {ep.uid} ({ep.task_id}) is an infra failure and must not be trained on; "
                             "drop it before batching")
        if not ep.prompt_ids:
            raise ValueError(f"episode {ep.uid} ({ep.task_id}) has an empty prompt")
    lens = [len(ep.prompt_ids) + len(ep.response_ids) for ep in episodes]
    size, width = len(episodes), max(lens)
    input_ids = torch.full((size, width), pad_token_id, dtype=torch.long)
    loss_mask = torch.zeros(size, width)
    rollout_logprobs = torch.zeros(size, width)
    turn_ids = torch.full((size, width), -1, dtype=torch.long)
    weight_versions = torch.full((size, width), -1, dtype=torch.long)
    for i, ep in enumerate(episodes):
        start, end = len(ep.prompt_ids), lens[i]
        input_ids[i, :end] = torch.tensor(ep.prompt_ids + ep.response_ids, dtype=torch.long)
        mask = torch.tensor(ep.response_mask, dtype=torch.float32)
        loss_mask[i, start:end] = mask
        rollout_logprobs[i, start:end] = torch.tensor(ep.response_logprobs, dtype=torch.float32) * mask
        if ep.turn_ids:
            turns = torch.tensor(ep.turn_ids, dtype=torch.long)
            turn_ids[i, start:end] = torch.where(mask.bool(), turns, torch.full_like(turns, -1))
        if ep.response_versions:
            versions = torch.tensor(ep.response_versions, dtype=torch.long)
            weight_versions[i, start:end] = torch.where(mask.bool(), versions, torch.full_like(versions, -1))
    adv = torch.tensor(advantages if advantages is not None else [0.0] * size, dtype=torch.float32)
    if adv.shape != (size,):
        raise ValueError(f"advantages has {adv.numel()} entries for {size} episodes")
    out = {
        "input_ids": input_ids,
        "seq_lens": torch.tensor(lens, dtype=torch.long),
        "loss_mask": loss_mask,
        "rollout_logprobs": rollout_logprobs,
        "turn_ids": turn_ids,
        "weight_versions": weight_versions,
        "advantages": adv[:, None] * loss_mask,
        "rewards": torch.tensor([ep.reward for ep in episodes], dtype=torch.float32),
    }
    if token_rewards is not None:
        out["token_rewards"] = _token_rewards(episodes, token_rewards, loss_mask)
    return TensorDict(out, batch_size=[size])


def _token_rewards(episodes: list[Episode], rewards: list[list[float]], loss_mask: torch.Tensor) -> torch.Tensor:
    if len(rewards) != len(episodes):
        raise ValueError(f"token_rewards has {len(rewards)} rows for {len(episodes)} episodes")
    out = torch.zeros_like(loss_mask)
    for i, (ep, row) in enumerate(zip(episodes, rewards)):
        if len(row) != len(ep.response_ids):
            raise ValueError(f"episode {ep.uid} ({ep.task_id}): {len(row)} token rewards for "
                             f"{len(ep.response_ids)} response tokens")
        start = len(ep.prompt_ids)
        out[i, start:start + len(row)] = torch.tensor(row, dtype=torch.float32)
    return out * loss_mask


def sft_batch(sequences: list[tuple[list[int], list[int]]], pad_token_id: int) -> TensorDict:
    """(input_ids, loss_mask) pairs of one transcript each -> the same layout, for `PolicyWorker.update_sft`.

    `loss_mask` is aligned with `input_ids` (1 on assistant tokens to learn, 0 on system/user/tool tokens).
    """
    if not sequences:
        raise ValueError("sft_batch got no sequences")
    width = max(len(ids) for ids, _ in sequences)
    size = len(sequences)
    input_ids = torch.full((size, width), pad_token_id, dtype=torch.long)
    loss_mask = torch.zeros(size, width)
    for i, (ids, mask) in enumerate(sequences):
        if len(ids) != len(mask):
            raise ValueError(f"sequence {i}: len(input_ids)={len(ids)} != len(loss_mask)={len(mask)}")
        input_ids[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        loss_mask[i, : len(ids)] = torch.tensor(mask, dtype=torch.float32)
    loss_mask[:, 0] = 0.0  # the first token has no logits to predict it
    return TensorDict({"input_ids": input_ids, "seq_lens": torch.tensor([len(ids) for ids, _ in sequences]),
                       "loss_mask": loss_mask}, batch_size=[size])


# ------------------------------------------------------------------------------------------ micro-batch planning


@dataclass
class MicroBatchPlan:
    """rows[rank][k]: batch row indices of micro-batch k on `rank` ([] = dummy); `width[rank][k]`: its padded
    length. Every rank has the same number of micro-batches."""

    rows: list[list[list[int]]]
    width: list[list[int]]

    @property
    def num_micro_batches(self) -> int:
        return len(self.rows[0])

    def padded_tokens(self) -> int:
        return sum(max(len(r), 1) * w for rank_rows, rank_w in zip(self.rows, self.width)
                   for r, w in zip(rank_rows, rank_w))


def _balance_ranks(lens: list[int], indices: list[int], world_size: int) -> list[list[int]]:
    """Longest-first greedy assignment of rows to the rank with the fewest tokens (ties: fewest rows)."""
    ranks: list[list[int]] = [[] for _ in range(world_size)]
    load = [0] * world_size
    for i in sorted(indices, key=lambda j: (-lens[j], j)):
        r = min(range(world_size), key=lambda k: (load[k], len(ranks[k]), k))
        ranks[r].append(i)
        load[r] += lens[i]
    return ranks


def _chunk_sorted(rows: list[int], lens: list[int], max_tokens: int | None, max_rows: int) -> list[list[int]]:
    """Cut rows sorted longest-first into chunks with rows x longest <= max_tokens (or <= max_rows rows)."""
    chunks: list[list[int]] = []
    for i in rows:
        if chunks:
            cur = chunks[-1]
            longest = lens[cur[0]]
            fits = (len(cur) + 1) * longest <= max_tokens if max_tokens is not None else len(cur) < max_rows
            if fits:
                cur.append(i)
                continue
        chunks.append([i])
    return chunks


def plan_micro_batches(lens: list[int], indices: list[int] | None = None, *, world_size: int = 1,
                       max_tokens: int | None = None, max_rows: int = 4, strategy: str = "bucket") -> MicroBatchPlan:
    """Split the rows `indices` (default: all) of a batch with row lengths `lens` over ranks and micro-batches.

    strategy "bucket": token-balanced ranks, length-sorted rows, micro-batches bounded by `max_tokens` padded
    tokens (or `max_rows` rows when `max_tokens` is None), each trimmed to its longest row. A single row longer
    than `max_tokens` gets a micro-batch of its own. strategy "full": rows in order, round-robin over ranks,
    `max_rows` per micro-batch, every micro-batch padded to the longest row of the whole batch (baseline).
    """
    if world_size < 1 or max_rows < 1:
        raise ValueError(f"world_size and max_rows must be >= 1, got {world_size}, {max_rows}")
    indices = list(range(len(lens))) if indices is None else list(indices)
    if strategy == "bucket":
        per_rank = _balance_ranks(lens, indices, world_size)
        chunks = [_chunk_sorted(sorted(rows, key=lambda j: (-lens[j], j)), lens, max_tokens, max_rows)
                  for rows in per_rank]
    elif strategy == "full":
        per_rank = [indices[r::world_size] for r in range(world_size)]
        chunks = [[rows[k:k + max_rows] for k in range(0, len(rows), max_rows)] for rows in per_rank]
    else:
        raise ValueError(f"unknown micro-batch strategy {strategy!r}; use 'bucket' or 'full'")
    target = max(1, max(len(c) for c in chunks))
    for rank_chunks in chunks:
        while len(rank_chunks) < target:
            splittable = [k for k, c in enumerate(rank_chunks) if len(c) > 1]
            if not splittable:
                rank_chunks.append([])
                continue
            k = max(splittable, key=lambda j: len(rank_chunks[j]))
            half = len(rank_chunks[k]) // 2
            rank_chunks[k:k + 1] = [rank_chunks[k][:half], rank_chunks[k][half:]]
    full_width = max((lens[i] for i in indices), default=1)
    width = [[(full_width if strategy == "full" else max(lens[i] for i in c)) if c else 2 for c in rank_chunks]
             for rank_chunks in chunks]
    return MicroBatchPlan(rows=chunks, width=width)


def take_rows(batch: TensorDict, rows: list[int], width: int) -> TensorDict:
    """Rows `rows` of `batch`, token tensors cut to `width` columns; [] gives an all-masked two-token dummy row."""
    if not rows:
        # Two tokens (one prediction) so the forward has a logit to compute; the mask keeps it out of the loss.
        out = {key: (torch.zeros_like(value[:1, :1]).expand(1, 2).contiguous() if key in TOKEN_KEYS
                     else value[:1].clone()) for key, value in batch.items()}
        out["input_ids"] = batch["input_ids"][:1, :1].expand(1, 2).contiguous()
        out["seq_lens"] = torch.full_like(batch["seq_lens"][:1], 2)
        return TensorDict(out, batch_size=[1])
    rows_td = batch[torch.tensor(rows, dtype=torch.long)]
    out = {key: value[:, :width].contiguous() if key in TOKEN_KEYS else value for key, value in rows_td.items()}
    return TensorDict(out, batch_size=[len(rows)])


def materialize(batch: TensorDict, plan: MicroBatchPlan) -> list[list[TensorDict]]:
    """Micro-batch TensorDicts per rank, following `plan`."""
    return [[take_rows(batch, rows, w) for rows, w in zip(rank_rows, rank_w)]
            for rank_rows, rank_w in zip(plan.rows, plan.width)]


def scatter_rows(values: list[list[torch.Tensor]], plan: MicroBatchPlan, size: int, width: int) -> torch.Tensor:
    """Inverse of `materialize` for per-token outputs: micro-batch [b, w] tensors -> one [size, width] tensor."""
    out = torch.zeros(size, width)
    for rank_vals, rank_rows in zip(values, plan.rows):
        for val, rows in zip(rank_vals, rank_rows):
            if rows:
                out[torch.tensor(rows, dtype=torch.long), : val.shape[1]] = val.to(out.dtype)
    return out


@dataclass
class SharedPrefixes:
    """A micro-batch split where each row's loss starts: the distinct prompts before that point (the layers run
    once per prompt, e.g. once per GRPO group) and every row's remainder, which attends to its prompt's K/V."""

    prefix_ids_U_P: torch.Tensor  # the distinct prefixes, right-padded
    prefix_lens_U: torch.Tensor
    group_B: torch.Tensor  # row -> index of its prefix
    starts_B: torch.Tensor  # row -> its prefix length (its first loss token; seq_len for a row without one)
    suffix_ids_B_S: torch.Tensor  # input_ids[starts:seq_len] per row, right-padded

    @property
    def saved_tokens(self) -> int:
        """Prompt tokens no longer run through the layers."""
        return int(self.prefix_lens_U[self.group_B].sum() - self.prefix_lens_U.sum())


def split_shared_prefixes(input_ids_B_L: torch.Tensor, target_B_L: torch.Tensor,
                          seq_lens_B: torch.Tensor) -> SharedPrefixes | None:
    """Split rows at their first target (loss) token and find the rows whose tokens before it are identical.
    None when no two rows share a prefix (nothing to save). Padding reuses token ids of the batch; it is never
    attended to (see `PolicyWorker._target_logits`)."""
    size = input_ids_B_L.shape[0]
    has_target = target_B_L.any(dim=1)
    starts = torch.where(has_target, target_B_L.float().argmax(dim=1), seq_lens_B)
    index: dict[tuple[int, ...], int] = {}
    rows = input_ids_B_L.tolist()
    group = [index.setdefault(tuple(rows[i][: int(starts[i])]), len(index)) for i in range(size)]
    if len(index) == size:
        return None
    prefixes = list(index)  # insertion order = group index
    prefix_lens = torch.tensor([len(p) for p in prefixes], dtype=torch.long)
    fill = int(input_ids_B_L[0, 0])
    prefix_ids = torch.full((len(prefixes), int(prefix_lens.max())), fill, dtype=torch.long)
    for u, p in enumerate(prefixes):
        prefix_ids[u, : len(p)] = torch.tensor(p, dtype=torch.long)
    suffix_lens = seq_lens_B - starts
    suffix_ids = torch.full((size, max(1, int(suffix_lens.max()))), fill, dtype=torch.long)
    for i in range(size):
        suffix_ids[i, : int(suffix_lens[i])] = input_ids_B_L[i, int(starts[i]): int(seq_lens_B[i])]
    return SharedPrefixes(prefix_ids_U_P=prefix_ids, prefix_lens_U=prefix_lens,
                          group_B=torch.tensor(group, dtype=torch.long), starts_B=starts.long(),
                          suffix_ids_B_S=suffix_ids)


def mini_batches(size: int, mini_batch_size: int, *, epochs: int = 1, shuffle: bool = True,
                 seed: int = 0) -> list[list[int]]:
    """Row indices of each optimizer step: `epochs` passes, each (optionally) shuffled with `seed + epoch` and cut
    into chunks of `mini_batch_size` rows (the last one may be smaller)."""
    if mini_batch_size < 1:
        raise ValueError(f"mini_batch_size must be >= 1, got {mini_batch_size}")
    out = []
    for epoch in range(epochs):
        if shuffle:
            gen = torch.Generator().manual_seed(seed * 1000 + epoch)
            order = torch.randperm(size, generator=gen).tolist()
        else:
            order = list(range(size))
        out.extend(order[k:k + mini_batch_size] for k in range(0, size, mini_batch_size))
    return out


__all__ = [
    "TOKEN_KEYS",
    "MicroBatchPlan",
    "SharedPrefixes",
    "episodes_to_batch",
    "materialize",
    "mini_batches",
    "plan_micro_batches",
    "scatter_rows",
    "sft_batch",
    "split_shared_prefixes",
    "take_rows",
]
