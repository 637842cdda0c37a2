"""LocalEngine: correctness of continuous batching against one-by-one generation and the trainer's logprobs."""

from __future__ import annotations

import asyncio
import copy
import random

import pytest
import torch

from agentrl.inference import EngineConfig, EngineError, PromptTooLongError
from agentrl.inference.local import LocalEngine
from agentrl.trainer.algos import logprobs_from_logits
from agentrl.types import SamplingParams


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    eng = LocalEngine.from_pretrained(tiny_model_dir, EngineConfig(max_batch_size=8, max_model_len=512))
    yield eng
    eng.close_sync()


def _prompts(n: int, seed: int, lo: int = 5, hi: int = 60, vocab: int = 3000) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def _trainer_logprobs(model, prompt: list[int], out: list[int], temperature: float) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + out])).logits[0, len(prompt) - 1:-1].float()
    return logprobs_from_logits(logits, torch.tensor(out), temperature=temperature)


def _hf_greedy(model, prompt: list[int], n: int, eos: list[int]) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=eos,
                             pad_token_id=0, attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
    return out[0, len(prompt):].tolist()


async def test_concurrent_ragged_requests_equal_sequential_greedy(engine):
    prompts = _prompts(12, seed=1, lo=3, hi=120)
    lengths = [random.Random(i).randint(4, 40) for i in range(12)]
    gens = await asyncio.gather(*[engine.generate(p, SamplingParams(max_new_tokens=n, temperature=0))
                                  for p, n in zip(prompts, lengths)])
    eos = sorted(engine.eos_token_ids)
    for p, n, g in zip(prompts, lengths, gens):
        assert g.token_ids == _hf_greedy(engine.model, p, n, eos)
        assert len(g.logprobs) == len(g.token_ids)
        assert g.finish_reason == ("stop" if g.token_ids[-1] in eos else "length")
    assert engine.stats["max_rows"] > 1  # the requests really shared decode steps


async def test_logprobs_equal_trainer_recomputation(engine):
    prompts = _prompts(6, seed=2, lo=5, hi=100)
    params = [SamplingParams(max_new_tokens=30, temperature=t, top_p=0.95, top_k=50 if i % 2 else -1, seed=i)
              for i, t in enumerate([0.0, 0.7, 1.0, 1.3, 0.5, 1.0])]
    gens = await asyncio.gather(*[engine.generate(p, sp) for p, sp in zip(prompts, params)])
    worst = 0.0
    for p, sp, g in zip(prompts, params, gens):
        t = sp.temperature if sp.temperature > 0 else 1.0
        ref = _trainer_logprobs(engine.model, p, g.token_ids, t)
        worst = max(worst, (torch.tensor(g.logprobs) - ref).abs().max().item())
    assert worst < 1e-4, f"engine logprobs differ from the trainer's by {worst}"


async def test_greedy_top_k_one_and_seeded_sampling(engine):
    prompt = _prompts(1, seed=3)[0]
    greedy = await engine.generate(prompt, SamplingParams(max_new_tokens=20, temperature=0))
    topk1 = await engine.generate(prompt, SamplingParams(max_new_tokens=20, temperature=1.0, top_k=1, seed=5))
    assert topk1.token_ids == greedy.token_ids
    # seeded: same result alone and inside a batch of other requests
    sp = SamplingParams(max_new_tokens=25, temperature=1.0, seed=123)
    alone = await engine.generate(prompt, sp)
    crowd = await asyncio.gather(engine.generate(prompt, sp),
                                 *[engine.generate(q, SamplingParams(max_new_tokens=25, temperature=1.0))
                                   for q in _prompts(5, seed=4)])
    assert crowd[0].token_ids == alone.token_ids
    other = await engine.generate(prompt, SamplingParams(max_new_tokens=25, temperature=1.0, seed=124))
    assert other.token_ids != alone.token_ids


async def test_stop_token_ids_and_max_new_tokens(engine):
    prompt = _prompts(1, seed=5)[0]
    free = await engine.generate(prompt, SamplingParams(max_new_tokens=30, temperature=0))
    assert free.finish_reason == "length" and len(free.token_ids) == 30
    stop_tok = free.token_ids[10]
    first = free.token_ids.index(stop_tok)
    stopped = await engine.generate(prompt, SamplingParams(max_new_tokens=30, temperature=0,
                                                           stop_token_ids=[stop_tok]))
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == free.token_ids[:first + 1]  # includes the stop token
    assert stopped.logprobs == pytest.approx(free.logprobs[:first + 1], abs=1e-5)


async def test_eos_from_generation_config_stops(engine):
    prompt = _prompts(1, seed=6)[0]
    free = await engine.generate(prompt, SamplingParams(max_new_tokens=20, temperature=0))
    eos_tok = free.token_ids[7]
    model = copy.deepcopy(engine.model)
    model.generation_config.eos_token_id = [eos_tok]
    eng2 = LocalEngine(model, engine.tokenizer, EngineConfig(max_batch_size=2))
    try:
        g = await eng2.generate(prompt, SamplingParams(max_new_tokens=20, temperature=0))
    finally:
        await eng2.close()
    assert g.finish_reason == "stop" and g.token_ids == free.token_ids[:free.token_ids.index(eos_tok) + 1]


async def test_ignore_eos_and_min_new_tokens(engine):
    prompt = _prompts(1, seed=6)[0]
    free = await engine.generate(prompt, SamplingParams(max_new_tokens=20, temperature=0))
    stop_tok = free.token_ids[0]
    # ignore_eos ignores stop_token_ids too (as SGLang): the turn runs to max_new_tokens on the same tokens
    ignored = await engine.generate(prompt, SamplingParams(max_new_tokens=20, temperature=0, ignore_eos=True,
                                                           stop_token_ids=[stop_tok]))
    assert ignored.finish_reason == "length" and ignored.token_ids == free.token_ids
    model = copy.deepcopy(engine.model)
    model.generation_config.eos_token_id = [stop_tok]  # the model's first greedy token is now its EOS
    eng2 = LocalEngine(model, engine.tokenizer, EngineConfig(max_batch_size=2))
    try:
        stops = await eng2.generate(prompt, SamplingParams(max_new_tokens=20, temperature=0))
        runs_on = await eng2.generate(prompt, SamplingParams(max_new_tokens=20, temperature=0, ignore_eos=True))
        at_least = await eng2.generate(prompt, SamplingParams(max_new_tokens=20, temperature=0, min_new_tokens=3))
    finally:
        await eng2.close()
    assert stops.finish_reason == "stop" and stops.token_ids == [stop_tok]
    assert runs_on.finish_reason == "length" and runs_on.token_ids == free.token_ids
    # min_new_tokens: EOS is masked out of the first 3 positions; greedy takes the best other token there
    assert len(at_least.token_ids) >= 3 and stop_tok not in at_least.token_ids[:3]
    with torch.no_grad():
        logits = engine.model(torch.tensor([prompt + at_least.token_ids])).logits[0, len(prompt) - 1:-1].float()
    masked = logits[:3].clone()
    masked[:, sorted(eng2.eos_token_ids)] = float("-inf")  # generation_config's EOS and the tokenizer's
    assert at_least.token_ids[:3] == masked.argmax(-1).tolist()
    expected = torch.log_softmax(masked, -1).gather(1, torch.tensor(at_least.token_ids[:3])[:, None])[:, 0]
    assert torch.allclose(torch.tensor(at_least.logprobs[:3]), expected, atol=1e-4)  # the masked distribution's
    with pytest.raises(ValueError, match="min_new_tokens must be in"):
        SamplingParams(max_new_tokens=4, min_new_tokens=5)


async def test_stop_strings_still_stop_with_ignore_eos(engine):
    tok = engine.tokenizer
    prompt = tok.encode("The answer to the question is")
    free = await engine.generate(prompt, SamplingParams(max_new_tokens=12, temperature=0))
    stop = tok.decode(free.token_ids[2:4], skip_special_tokens=False)
    g = await engine.generate(prompt, SamplingParams(max_new_tokens=12, temperature=0, stop=[stop], ignore_eos=True))
    assert g.finish_reason == "stop" and g.metrics["matched_stop"] == stop and len(g.token_ids) < 12


async def test_stop_string_checked_on_decoded_text(engine):
    tok = engine.tokenizer
    prompt = tok.encode("The answer to the question is")
    free = await engine.generate(prompt, SamplingParams(max_new_tokens=40, temperature=0))
    text = tok.decode(free.token_ids, skip_special_tokens=False)
    stop = next((text[i:i + 3] for i in range(len(text) // 3, len(text) - 3) if text[i:i + 3].strip() == text[i:i + 3]),
                text[len(text) // 2:len(text) // 2 + 2])
    g = await engine.generate(prompt, SamplingParams(max_new_tokens=40, temperature=0, stop=[stop]))
    assert g.finish_reason == "stop"
    got = tok.decode(g.token_ids, skip_special_tokens=False)
    assert stop in got and stop not in tok.decode(g.token_ids[:-1], skip_special_tokens=False)
    assert g.token_ids == free.token_ids[:len(g.token_ids)]


async def test_weight_update_applies_to_next_request(engine):
    prompt = _prompts(1, seed=7)[0]
    sp = SamplingParams(max_new_tokens=15, temperature=0)
    before = await engine.generate(prompt, sp)
    original = {k: v.clone() for k, v in engine.model.state_dict().items()}
    g = torch.Generator().manual_seed(0)
    new = {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in original.items()}
    version = engine.weight_version
    await engine.update_weights(new)
    after = await engine.generate(prompt, sp)
    assert after.metrics["weight_version"] == version + 1
    assert after.token_ids != before.token_ids
    ref = _trainer_logprobs(engine.model, prompt, after.token_ids, 1.0)
    assert (torch.tensor(after.logprobs) - ref).abs().max().item() < 1e-4
    with pytest.raises(ValueError, match="not parameters"):
        await engine.update_weights({"nope.weight": torch.zeros(1)})
    await engine.update_weights(original)
    restored = await engine.generate(prompt, sp)
    assert restored.token_ids == before.token_ids


async def test_bad_inputs_raise_clear_errors(engine):
    with pytest.raises(ValueError, match="empty"):
        await engine.generate([], SamplingParams(max_new_tokens=4))
    with pytest.raises(ValueError, match="vocab"):
        await engine.generate([1, 10**7], SamplingParams(max_new_tokens=4))
    with pytest.raises(PromptTooLongError, match="max_model_len"):
        await engine.generate([5] * 512, SamplingParams(max_new_tokens=4))
    # prompt + max_new_tokens past the window: generation is cut at the window, finish "length"
    g = await engine.generate([5] * 500, SamplingParams(max_new_tokens=50, temperature=0))
    assert g.finish_reason in ("length", "stop") and len(g.token_ids) <= 12
    assert g.finish_reason == "stop" or len(g.token_ids) == 12


async def test_queue_bound_abort_and_cancel(tiny_model_dir):
    eng = LocalEngine.from_pretrained(tiny_model_dir, EngineConfig(max_batch_size=1, max_queued_requests=1))
    try:
        sp = SamplingParams(max_new_tokens=400, temperature=0)
        with eng._step_lock:  # freeze the scheduler so the queue fills deterministically
            first = asyncio.create_task(eng.generate([5, 6, 7], sp, request_id="a"))
            await asyncio.sleep(0.05)
            with pytest.raises(EngineError, match="queue full"):
                await eng.generate([5, 6, 7], sp)
        while eng.num_running == 0:
            await asyncio.sleep(0.01)
        assert eng.abort("a") is True
        g = await first
        assert g.finish_reason == "abort" and len(g.token_ids) < 400
        assert g.metrics["aborted_by"] == "request"  # not a weight update: the agent loop does not restart it
        assert eng.abort("a") is False
        # cancelling the awaiting task frees the slot for the next request
        task = asyncio.create_task(eng.generate([8, 9], sp))
        while eng.num_running == 0:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        nxt = await eng.generate([8, 9], SamplingParams(max_new_tokens=3, temperature=0))
        assert nxt.finish_reason == "length" and eng.num_running == 0
    finally:
        await eng.close()
    with pytest.raises(EngineError, match="closed"):
        await eng.generate([1], SamplingParams(max_new_tokens=1))


async def test_decoding_runs_off_the_event_loop(engine):
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.005)
            ticks += 1

    t = asyncio.create_task(ticker())
    steps = engine.stats["steps"]
    await asyncio.gather(*[engine.generate(p, SamplingParams(max_new_tokens=60, temperature=0))
                           for p in _prompts(8, seed=8, lo=50, hi=120)])
    t.cancel()
    decode_steps = engine.stats["steps"] - steps
    assert decode_steps >= 50
    assert ticks >= 5, "the event loop was blocked while the engine decoded"


async def test_many_queued_requests_keep_kv_cache_bounded(tiny_model_dir):
    cfg = EngineConfig(max_batch_size=4, max_model_len=128)
    eng = LocalEngine.from_pretrained(tiny_model_dir, cfg)
    try:
        prompts = _prompts(256, seed=9, lo=4, hi=40)
        gens = await asyncio.gather(*[eng.generate(p, SamplingParams(max_new_tokens=3, temperature=0))
                                      for p in prompts])
    finally:
        await eng.close()
    assert len(gens) == 256 and all(len(g.token_ids) >= 1 for g in gens)
    assert eng.stats["max_rows"] <= 4
    assert eng.stats["max_token_slots"] <= cfg.max_batch_size * cfg.max_model_len


async def test_a_failing_step_fails_its_requests_and_the_engine_keeps_serving(engine, monkeypatch):
    real_forward = engine.model.forward
    calls = {"n": 0}

    def flaky_forward(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("simulated out of memory")
        return real_forward(*args, **kwargs)

    monkeypatch.setattr(engine.model, "forward", flaky_forward)
    with pytest.raises(EngineError, match="simulated out of memory"):
        await engine.generate([3, 4, 5], SamplingParams(max_new_tokens=5, temperature=0))
    g = await engine.generate([3, 4, 5], SamplingParams(max_new_tokens=5, temperature=0))
    assert g.finish_reason == "length" and len(g.token_ids) == 5


async def test_session_turns_reuse_kv_and_match_fresh_generation(engine):
    prompt = _prompts(1, seed=10, lo=60, hi=60)[0]
    sp = SamplingParams(max_new_tokens=12, temperature=0.9, seed=4)
    turn1 = await engine.generate(prompt, sp, session_id="episode-1")
    assert turn1.metrics["cached_tokens"] == 0
    prompt2 = prompt + turn1.token_ids + [101, 102, 103, 104]  # + a tool observation
    cached_before = engine.stats["cached_tokens"]
    turn2 = await engine.generate(prompt2, sp, session_id="episode-1")
    assert turn2.metrics["cached_tokens"] == len(prompt) + len(turn1.token_ids) - 1
    assert engine.stats["cached_tokens"] - cached_before == turn2.metrics["cached_tokens"]
    fresh = await engine.generate(prompt2, sp)  # no session: only turn 1's prompt is shared (SharedPrefixCache)
    assert fresh.metrics["cached_tokens"] == len(prompt)
    assert turn2.token_ids == fresh.token_ids
    ref = _trainer_logprobs(engine.model, prompt2, turn2.token_ids, 0.9)
    assert (torch.tensor(turn2.logprobs) - ref).abs().max().item() < 1e-4
    # a diverging prompt reuses only the shared part; a weight update drops every cached session
    turn3 = await engine.generate(prompt2[:30] + [7] * 20, sp, session_id="episode-1")
    assert turn3.metrics["cached_tokens"] == 30  # the part shared with turn 2's prompt + output
    assert turn3.token_ids == (await engine.generate(prompt2[:30] + [7] * 20, sp)).token_ids
    await engine.update_weights({k: v.clone() for k, v in engine.model.state_dict().items()})
    again = await engine.generate(prompt2[:30] + [7] * 20 + [9], sp, session_id="episode-1")
    assert again.metrics["cached_tokens"] == 0


async def test_shared_prompt_prefixes_are_prefilled_once_and_change_no_output(tiny_model_dir):
    """A GRPO-like batch: 4 prompts sharing a 70-token system prefix, 4 samples each, all submitted at once. With
    the shared-prefix cache each distinct prompt is prefilled once, after the prefix; tokens and logprobs equal an
    engine without it."""
    rng = random.Random(3)
    system = [rng.randrange(10, 3000) for _ in range(70)]
    prompts = [system + [rng.randrange(10, 3000) for _ in range(rng.randint(5, 30))] for _ in range(4)]
    params = [SamplingParams(max_new_tokens=10, temperature=0.8, seed=100 + i) for i in range(16)]
    results = {}
    for shared in (0, 4096):
        eng = LocalEngine.from_pretrained(tiny_model_dir, EngineConfig(max_batch_size=16, max_model_len=256,
                                                                       shared_prefix_cache_tokens=shared))
        try:
            first = await eng.generate(prompts[0][:75], SamplingParams(max_new_tokens=1, temperature=0))
            gens = await asyncio.gather(*[eng.generate(prompts[i // 4], sp) for i, sp in enumerate(params)])
            results[shared] = (first, gens, dict(eng.stats))
        finally:
            eng.close_sync()
    (_, plain, plain_stats), (_, cached, stats) = results[0], results[4096]
    for a, b in zip(plain, cached):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4
    assert all(g.metrics["cached_tokens"] == 0 for g in plain)
    # the first request's prompt (system + 5 tokens) is kept; every later prompt starts after its shared part
    assert all(g.metrics["cached_tokens"] >= 70 for g in cached)
    assert plain_stats["prefill_tokens"] == 75 + sum(len(p) for p in prompts)
    assert stats["prefill_tokens"] == 75 + (len(prompts[0]) - 75) + sum(len(p) - 70 for p in prompts[1:])
    # identical prompts are prefilled once per admission: 4 distinct prompts -> at most 4 prefills after the first
    assert plain_stats["prefills"] == 1 + 4 and stats["prefills"] == 1 + 4
