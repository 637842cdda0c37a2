"""`rollout.on_weight_update: abort`: a turn the engine aborted because new weights arrived is sampled again from
the same context (the aborted tokens are dropped), at most `MAX_TURN_RESTARTS` times, and counted as the
episode's `turn_restarts`; any other abort stays an engine fault. With the real LocalEngine the update lands
between two known decode steps (`LocalEngine.step_hook`), never by timing."""

from __future__ import annotations

from helpers import forcing_weights
from scripted_engine import ScriptedEngine

from agentrl.agent_loop import AgentLoopConfig, ToolAgentLoop
from agentrl.agent_loop.tool_agent import MAX_TURN_RESTARTS
from agentrl.types import Generation, SamplingParams, Task

TASK = Task(prompt=[{"role": "user", "content": "What is 2+2?"}], task_id="t0")
CONFIG = AgentLoopConfig(max_new_tokens_per_turn=8, max_response_tokens=64)


def aborted(by: str) -> Generation:
    """A turn cut after three tokens, as an engine returns it when `by` aborted the request."""
    return Generation(token_ids=[11, 12, 13], logprobs=[-0.1] * 3, finish_reason="abort",
                      metrics={"aborted_by": by})


async def test_a_turn_aborted_by_a_weight_update_restarts_from_the_same_context(tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, [aborted("weight_update"), aborted("weight_update"), "4"])
    episode = await ToolAgentLoop(engine, tiny_tokenizer, None, CONFIG).run(TASK, uid="g")

    episode.check()
    assert not episode.infra_error and episode.finish_reason == "stop"
    assert episode.metrics["turn_restarts"] == 2 and episode.num_turns == 1
    assert len({tuple(c.input_ids) for c in engine.calls}) == 1  # every attempt saw the same context
    assert episode.response_ids == engine.calls[-1].output.token_ids  # the aborted tokens are not in the episode
    assert [t.get("restarted", False) for t in episode.turns] == [True, True, False]
    assert [t["finish_reason"] for t in episode.turns] == ["abort", "abort", "stop"]


async def test_too_many_restarts_and_other_aborts_are_engine_faults(tiny_tokenizer):
    script = [aborted("weight_update")] * (MAX_TURN_RESTARTS + 1)
    engine = ScriptedEngine(tiny_tokenizer, script)
    episode = await ToolAgentLoop(engine, tiny_tokenizer, None, CONFIG).run(TASK, uid="g")
    assert episode.infra_error and episode.metrics["stop_detail"] == "engine_error"
    assert episode.metrics["turn_restarts"] == MAX_TURN_RESTARTS and len(engine.calls) == MAX_TURN_RESTARTS + 1
    assert "weight updates in a row" in episode.metrics["infra_detail"]
    assert "rollout.on_weight_update" in episode.metrics["infra_detail"]
    assert episode.response_ids == []

    for by in ("request", "pause", None):  # Engine.abort, a paused server, an engine that gives no cause
        gen = aborted(by) if by else Generation(token_ids=[11], logprobs=[-0.1], finish_reason="abort")
        engine = ScriptedEngine(tiny_tokenizer, [gen, "4"])
        episode = await ToolAgentLoop(engine, tiny_tokenizer, None, CONFIG).run(TASK, uid="g")
        assert episode.infra_error and len(engine.calls) == 1
        assert "turn_restarts" not in episode.metrics and "aborted" in episode.metrics["infra_detail"]


async def test_local_engine_update_mid_turn_resamples_the_turn_under_the_new_weights(tiny_model_dir):
    from agentrl.inference.config import EngineConfig
    from agentrl.inference.local import LocalEngine

    engine = LocalEngine.from_pretrained(tiny_model_dir, EngineConfig(max_model_len=512))
    try:
        loop = ToolAgentLoop(engine, engine.tokenizer, None, CONFIG)
        forcing, forced = forcing_weights(engine.model, set(loop.stop_token_ids))
        target = engine.stats["steps"] + 1

        def update_mid_turn(eng: LocalEngine) -> None:  # after step 1: two tokens of the first turn exist
            if eng.stats["steps"] == target:
                eng.step_hook = None
                eng.update_weights_sync(forcing, on_running="abort")

        engine.step_hook = update_mid_turn
        episode = await loop.run(TASK, sampling=SamplingParams(max_new_tokens=1, temperature=0.0))
    finally:
        await engine.close()

    episode.check()
    assert not episode.infra_error and episode.metrics["turn_restarts"] == 1
    first, second = episode.turns
    assert first["finish_reason"] == "abort" and first["tokens"] == 2 and first["weight_version"] == 0
    assert first["input_tokens"] == second["input_tokens"]  # resampled from the same context
    assert second["weight_version"] == 1
    # the whole turn is the new model's (it emits `forced` after any context); none of the aborted tokens remain
    assert episode.response_ids == [forced] * CONFIG.max_new_tokens_per_turn
    assert episode.response_versions == [1] * CONFIG.max_new_tokens_per_turn
    assert episode.finish_reason == "length" and episode.metrics["stop_detail"] == "turn_length"
