"""LocalEngine: every token records the weight version that sampled it, and a weight update in the middle of a
request either re-prefills it under the new weights ("continue") or returns it aborted ("abort").

The update is placed between known decode steps by `LocalEngine.step_hook` (runs on the decode thread after each
step), never by timing. After step k of a lone request, k + 1 tokens exist (the first step prefills, samples the
first token and decodes the second).
"""

from __future__ import annotations

import asyncio

import pytest
import torch
from helpers import forcing_weights

from agentrl.inference import EngineConfig
from agentrl.inference.local import LocalEngine
from agentrl.trainer.algos import logprobs_from_logits
from agentrl.types import SamplingParams

PROMPT = [17, 402, 96, 1203, 58, 77, 311, 940, 12, 2047, 33]
GREEDY = SamplingParams(max_new_tokens=12, temperature=0, ignore_eos=True)


@pytest.fixture
def engine(tiny_model_dir):
    eng = LocalEngine.from_pretrained(tiny_model_dir, EngineConfig(max_batch_size=4, max_model_len=256))
    yield eng
    eng.close_sync()


def _update_after_step(engine: LocalEngine, step: int, **update) -> None:
    """Run `update_weights_sync(**update)` on the decode thread right after scheduler step `step` (counted from
    now), i.e. between two known decode steps."""
    target = engine.stats["steps"] + step

    def hook(eng: LocalEngine) -> None:
        if eng.stats["steps"] == target:
            eng.step_hook = None
            eng.update_weights_sync(**update)

    engine.step_hook = hook


def _direct_logprobs(model, prompt: list[int], out: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + out])).logits[0, len(prompt) - 1:-1].float()
    return logprobs_from_logits(logits, torch.tensor(out), temperature=1.0)


async def test_each_token_carries_the_version_that_sampled_it(engine):
    before = await engine.generate(PROMPT, GREEDY)
    assert before.weight_versions == [0] * 12
    forcing, forced = forcing_weights(engine.model, set(before.token_ids))
    _update_after_step(engine, 3, weights=forcing)

    g = await engine.generate(PROMPT, GREEDY)

    assert g.finish_reason == "length"
    assert g.weight_versions == [0] * 4 + [1] * 8  # the update landed after step 3: 4 tokens sampled before it
    assert g.token_ids[:4] == before.token_ids[:4]  # the old model's greedy output
    assert g.token_ids[4:] == [forced] * 8  # every later token is the new model's, none over old-weight KV
    assert g.metrics["weight_version"] == 1 and g.metrics["weight_version_start"] == 0
    assert engine.stats["retracted"] == 1


async def test_a_retracted_row_decodes_as_a_fresh_prefill_under_the_new_weights(engine):
    prompts = [PROMPT, PROMPT[:5], [9, 8, 7, 6, 5, 4, 3, 2, 1, 10, 11, 12, 13, 14, 15, 16, 17, 18]]
    gen = torch.Generator().manual_seed(0)
    new = {k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in engine.model.state_dict().items()}
    _update_after_step(engine, 2, weights=new)

    gens = await asyncio.gather(*[engine.generate(p, GREEDY) for p in prompts])

    assert engine.weight_version == 1
    for prompt, g in zip(prompts, gens):
        assert g.weight_versions == [0] * 3 + [1] * 9
        ref = _direct_logprobs(engine.model, prompt, g.token_ids)  # the new weights, prompt + all tokens at once
        assert (torch.tensor(g.logprobs[3:]) - ref[3:]).abs().max().item() < 1e-5
        with torch.no_grad():  # greedy under the new weights after the prefix the old ones sampled
            logits = engine.model(torch.tensor([prompt + g.token_ids])).logits[0, len(prompt) + 2:-1]
        assert g.token_ids[3:] == logits.argmax(-1).tolist()


async def test_abort_mode_returns_the_tokens_so_far_and_waiting_requests_start_on_new_weights(tiny_model_dir):
    eng = LocalEngine.from_pretrained(tiny_model_dir, EngineConfig(max_batch_size=1, max_model_len=256))
    try:
        before = await eng.generate(PROMPT, GREEDY)
        forcing, forced = forcing_weights(eng.model, set(before.token_ids))
        _update_after_step(eng, 3, weights=forcing, on_running="abort")

        # one slot: the second request waits in the queue while the first decodes
        running, waiting = await asyncio.gather(eng.generate(PROMPT, GREEDY), eng.generate(PROMPT[:6], GREEDY))

        assert running.finish_reason == "abort"
        assert running.token_ids == before.token_ids[:4] and running.weight_versions == [0] * 4
        assert running.metrics["weight_version"] == 0  # it never ran on the new weights
        assert running.metrics["aborted_by"] == "weight_update"  # what tells the agent loop to restart the turn
        assert "aborted_by" not in waiting.metrics
        assert waiting.finish_reason == "length"
        assert waiting.token_ids == [forced] * 12 and waiting.weight_versions == [1] * 12
    finally:
        eng.close_sync()


async def test_continue_mode_keeps_the_queue_order_with_one_slot(tiny_model_dir):
    eng = LocalEngine.from_pretrained(tiny_model_dir, EngineConfig(max_batch_size=1, max_model_len=256))
    try:
        before = await eng.generate(PROMPT, GREEDY)
        forcing, forced = forcing_weights(eng.model, set(before.token_ids))
        _update_after_step(eng, 2, weights=forcing)
        running, waiting = await asyncio.gather(eng.generate(PROMPT, GREEDY), eng.generate(PROMPT[:6], GREEDY))
        assert running.token_ids == before.token_ids[:3] + [forced] * 9
        assert running.weight_versions == [0] * 3 + [1] * 9
        assert waiting.token_ids == [forced] * 12 and waiting.weight_versions == [1] * 12
    finally:
        eng.close_sync()


async def test_pause_holds_new_requests_and_abort_pause_returns_partial_output(engine):
    before = await engine.generate(PROMPT, GREEDY)
    forcing, forced = forcing_weights(engine.model, set(before.token_ids))

    target = engine.stats["steps"] + 2

    def pause_abort(eng: LocalEngine) -> None:
        if eng.stats["steps"] == target:
            eng.step_hook = None
            eng.pause("abort")

    engine.step_hook = pause_abort
    partial = await engine.generate(PROMPT, GREEDY)
    assert partial.finish_reason == "abort" and partial.token_ids == before.token_ids[:3]
    assert partial.metrics["aborted_by"] == "pause"
    assert engine.paused

    # submitted while paused: nothing is sampled until resume, so every token is the new weights'
    task = asyncio.ensure_future(engine.generate(PROMPT, GREEDY))
    await asyncio.sleep(0)  # let the request reach the queue
    await engine.update_weights(forcing)
    assert not task.done()
    engine.resume()
    g = await task
    assert g.token_ids == [forced] * 12 and g.weight_versions == [1] * 12


async def test_retract_pause_reprefills_on_resume(engine):
    before = await engine.generate(PROMPT, GREEDY)
    target = engine.stats["steps"] + 2

    def pause_retract(eng: LocalEngine) -> None:
        if eng.stats["steps"] == target:
            eng.step_hook = None
            eng.pause("retract")
            eng.resume()

    engine.step_hook = pause_retract
    g = await engine.generate(PROMPT, GREEDY)
    assert engine.stats["retracted"] == 1
    assert g.token_ids == before.token_ids  # same weights: re-prefilling changes nothing
    assert (torch.tensor(g.logprobs) - torch.tensor(before.logprobs)).abs().max().item() < 1e-5
    with pytest.raises(ValueError, match="pause mode"):
        engine.pause("drain")
    with pytest.raises(ValueError, match="on_running"):
        engine.update_weights_sync({}, on_running="wait")
