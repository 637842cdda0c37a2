"""PaddedKVBatch (rows join, decode, leave, buffers regrow), the prefill grouping plan and the prefills (padded,
after cached prefixes)."""

from __future__ import annotations

import random

import pytest
import torch

from agentrl.inference.kv_batch import PaddedKVBatch
from agentrl.inference.prefill import plan_groups

LAYERS, HEADS, DIM = 2, 2, 4


def _row(tag: int, n: int):
    """Per layer K/V [heads, n, dim] whose values name the row, layer and position: easy to check later."""
    pos = torch.arange(n, dtype=torch.float32).view(1, n, 1).expand(HEADS, n, DIM)
    return [(tag * 1000 + li * 100 + pos, -(tag * 1000 + li * 100 + pos)) for li in range(LAYERS)]


def _decode(batch: PaddedKVBatch, tags: list[int]) -> None:
    """One decode step as the model does it: write each row's next position, then advance."""
    batch.reserve_step()
    mask, pos = batch.step_inputs(mask_4d=True)
    assert mask.shape == (len(tags), 1, 1, batch.width + 1) and pos[:, 0].tolist() == batch.lengths
    for li in range(LAYERS):
        k = torch.stack([torch.full((HEADS, 1, DIM), float(t * 1000 + li * 100 + n))
                         for t, n in zip(tags, batch.lengths)])
        keys, _ = batch.cache.layers[li].update(k, -k, li)
        assert keys.shape[2] == batch.width + 1
        # masked-out columns hold zeros, never stale or uninitialised values
        assert torch.all(keys.masked_fill(mask[:, :, 0, :, None].expand_as(keys), 0) == 0)
    batch.advance()


def _check(batch: PaddedKVBatch, tags: list[int]) -> None:
    for row, tag in enumerate(tags):
        for li, (k, v) in enumerate(batch.row_kv(row)):
            expect = tag * 1000 + li * 100 + torch.arange(batch.lengths[row], dtype=torch.float32)
            assert torch.equal(k[0, :, :, 0], expect.expand(HEADS, -1)) and torch.equal(v, -k)


def test_rows_join_decode_leave_and_keep_their_kv():
    batch = PaddedKVBatch(max_width=512, max_rows=8, headroom=4)
    tags, lengths = [1, 2, 3], [5, 9, 2]
    batch.add([_row(t, n) for t, n in zip(tags, lengths)], lengths)
    _check(batch, tags)
    for _ in range(7):  # past the headroom: the buffers regrow and keep the rows
        _decode(batch, tags)
    _check(batch, tags)
    order = batch.drop([0])  # the last row moves into the hole
    tags = [tags[i] for i in order]
    assert tags == [3, 2] and batch.width == max(batch.lengths)
    _check(batch, tags)
    batch.add([_row(4, 40), _row(5, 1)], [40, 1])  # a longer row widens the window for everyone
    tags += [4, 5]
    _decode(batch, tags)
    _check(batch, tags)
    order = batch.drop([2, 0])
    tags = [tags[i] for i in order]
    assert sorted(tags) == [2, 5] and batch.width == max(batch.lengths)
    _decode(batch, tags)
    _check(batch, tags)
    slots, storage = batch.token_slots(), batch.k[0].data_ptr()
    assert batch.drop([0, 1]) == [] and len(batch) == 0 and batch.token_slots() == slots  # kept while idle
    batch.add([_row(6, 3)], [3])  # the next request reuses the idle buffers
    assert batch.k[0].data_ptr() == storage
    _decode(batch, [6])
    _check(batch, [6])
    batch.drop([0])
    batch.release()
    assert batch.token_slots() == 0 and batch.cache is None


def test_random_churn_stays_consistent_and_bounded():
    rng = random.Random(0)
    batch = PaddedKVBatch(max_width=300, max_rows=6, headroom=8)
    tags: list[int] = []
    next_tag = 1
    for _ in range(60):
        free = 6 - len(tags)
        if free and rng.random() < 0.5:
            k = rng.randint(1, free)
            lengths = [rng.randint(1, 60) for _ in range(k)]
            batch.add([_row(next_tag + j, n) for j, n in enumerate(lengths)], lengths)
            tags += list(range(next_tag, next_tag + k))
            next_tag += k
        if tags and rng.random() < 0.3:
            dead = rng.sample(range(len(tags)), rng.randint(1, len(tags)))
            tags = [tags[i] for i in batch.drop(dead)]
        if tags:
            _decode(batch, tags)
            _check(batch, tags)
        assert batch.token_slots() <= 6 * 300


def test_plan_groups_balances_padding_against_passes():
    assert plan_groups([], 4096) == []
    assert plan_groups([50] * 8, 4096) == [list(range(8))]  # equal lengths: one pass
    groups = plan_groups([10, 2000, 12, 1990], 8192, pass_cost_tokens=32)
    assert groups == [[1, 3], [2, 0]]  # long with long, short with short
    bounded = plan_groups([100] * 10, 300)
    assert all(len(g) * 100 <= 300 for g in bounded)
    assert plan_groups([5000, 10], 4096) == [[0], [1]]  # a prompt longer than the cap still gets its pass
    lengths = [random.Random(1).randint(1, 300) for _ in range(40)]
    flat = sorted(i for g in plan_groups(lengths, 1024) for i in g)
    assert flat == list(range(40))


def _alone(model, prompt: list[int]):
    """One prompt run by itself: per layer K/V [kv_heads, n, head_dim] and the next-token logits [vocab]."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    out = model(input_ids=torch.tensor([prompt]), use_cache=True, cache=cache)
    return [(layer.keys[0], layer.values[0]) for layer in cache.layers], out.logits[0, -1].float()


def _assert_each_row_as_alone(model, prompts, rows, logits) -> None:
    for p, row, lg in zip(prompts, rows, logits):
        alone_row, alone_logits = _alone(model, p)
        assert torch.allclose(lg, alone_logits, atol=1e-5)
        for (k, v), (k1, v1) in zip(row, alone_row):
            assert k.shape == k1.shape == (model.config.num_key_value_heads, len(p), k.shape[-1])
            assert torch.allclose(k, k1, atol=1e-5) and torch.allclose(v, v1, atol=1e-5)


def test_padded_prefill_matches_one_row_prefill(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from agentrl.inference.prefill import prefill_padded

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    prompts = [[5 + i for i in range(n)] for n in (7, 30, 1, 19)]
    with torch.inference_mode():
        rows, logits = prefill_padded(model, prompts, "cache", "cpu")
        _assert_each_row_as_alone(model, prompts, rows, logits)
        # a model whose forward ignores logits_to_keep (returns every position) gives the same next-token logits
        real_forward = model.forward
        model.forward = lambda **kw: real_forward(**{**kw, "logits_to_keep": 0})
        _, all_positions = prefill_padded(model, prompts, "cache", "cpu")
    assert torch.allclose(all_positions, logits, atol=1e-5)


@pytest.mark.parametrize("trimmed", [False, True])
def test_prefill_after_cached_prefixes_matches_one_row_prefill(tiny_model_dir, trimmed):
    """Rows with cached prefixes of different lengths (and one without) in one pass: each row's K/V and logits are
    those of its whole prompt run alone."""
    from transformers import AutoModelForCausalLM

    from agentrl.inference.prefill import LastLayerTrim, prefill_after_prefixes

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    rng = random.Random(5)
    prompts = [[rng.randrange(10, 3000) for _ in range(n)] for n in (40, 90, 13, 120, 61)]
    cuts = [20, 0, 12, 100, 60]  # 0: no cached prefix; 12 of 13 and 60 of 61: one new token
    trim = LastLayerTrim(model) if trimmed else None
    with torch.inference_mode():
        prefixes = [None if c == 0 else (c, [(k[:, :c].unsqueeze(0), v[:, :c].unsqueeze(0))
                                             for k, v in _alone(model, p[:c])[0]])
                    for p, c in zip(prompts, cuts)]
        rows, logits = prefill_after_prefixes(model, prompts, prefixes, "cache", "cpu", trim=trim)
        _assert_each_row_as_alone(model, prompts, rows, logits)


def test_last_layer_trim_is_exact_and_leaves_other_threads_alone(tiny_model_dir):
    import threading

    from transformers import AutoModelForCausalLM

    from agentrl.inference.prefill import LastLayerTrim, prefill_padded

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    prompts = [[9 + i for i in range(n)] for n in (23, 5, 40)]
    trim = LastLayerTrim(model)
    assert trim.verify(model, "cache", "cpu")
    with torch.inference_mode():
        plain_rows, plain = prefill_padded(model, prompts, "cache", "cpu")
        rows, trimmed = prefill_padded(model, prompts, "cache", "cpu", trim=trim)
        assert torch.allclose(trimmed, plain, atol=1e-5)
        assert all(torch.equal(k, k2) for r, r2 in zip(rows, plain_rows) for (k, _), (k2, _) in zip(r, r2))
        # inside the trim, another thread's forward passes (a trainer sharing the model) see every position
        ids = torch.tensor([prompts[2]])
        expect = model(input_ids=ids).logits
        seen = {}
        with trim.at(torch.tensor([3])):
            def trainer():
                with torch.inference_mode():
                    seen["logits"] = model(input_ids=ids).logits

            worker = threading.Thread(target=trainer)
            worker.start()
            worker.join()
        assert torch.allclose(seen["logits"], expect, atol=1e-6)
    assert not trim.targets[0]._forward_pre_hooks  # hooks are gone after the block
    # a model whose layers do not fit the pattern: verify switches the trim off
    first = model.model.layers[0]
    wrong = LastLayerTrim(model)
    wrong.targets = [first.self_attn.o_proj, first.mlp]
    assert wrong.verify(model, "cache", "cpu") is False and wrong.enabled is False
