"""Every path of ToolAgentLoop, driven by a scripted engine (tiny tokenizer; in-process tools)."""

from __future__ import annotations

import pytest
from scripted_engine import Rendezvous, ScriptedEngine, model_turn, tool_call

from agentrl.agent_loop import AgentLoopConfig, ToolAgentLoop
from agentrl.inference.base import EngineError, PromptTooLongError
from agentrl.tools import ToolRegistry
from agentrl.types import Generation, Task

PROMPT = [{"role": "user", "content": "What is 2+2?"}]


def make(tokenizer, registry, script, *, task_tools=None, **config):
    engine = ScriptedEngine(tokenizer, script)
    loop = ToolAgentLoop(engine, tokenizer, registry, AgentLoopConfig(**config))
    return loop, engine, Task(prompt=PROMPT, tools=task_tools, task_id="t0")


def assert_aligned(episode):
    episode.check()
    assert all(lp == 0.0 for lp, m in zip(episode.response_logprobs, episode.response_mask) if m == 0)
    assert all(lp < 0.0 for lp, m in zip(episode.response_logprobs, episode.response_mask) if m == 1)


async def test_final_answer_in_first_turn(tiny_tokenizer, registry):
    loop, engine, task = make(tiny_tokenizer, registry, ["<answer>4</answer>"])
    episode = await loop.run(task, uid="g1")
    assert (episode.finish_reason, episode.metrics["stop_detail"]) == ("stop", "final_answer")
    assert episode.num_turns == 1 and episode.tool_calls == [] and not episode.infra_error
    assert episode.response_mask == [1] * len(episode.response_ids)
    assert episode.response_ids[-1] == loop.end_of_turn_id
    assert episode.messages[-1] == {"role": "assistant", "content": "<answer>4</answer>"}
    assert episode.uid == "g1" and episode.task_id == "t0"
    assert_aligned(episode)


async def test_sampling_params_per_turn(tiny_tokenizer, registry, tiny_model_dir):
    from agentrl.types import SamplingParams

    script = [model_turn("", [("add", {"a": 2, "b": 2})]), "4"]
    loop, engine, task = make(tiny_tokenizer, registry, script, max_new_tokens_per_turn=64, max_response_tokens=500)
    await loop.run(task, sampling=SamplingParams(max_new_tokens=1, temperature=0.7, top_p=0.9, top_k=5, seed=3),
                   session_id="ep-7")
    first, second = engine.calls
    im_end = tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
    eot = tiny_tokenizer.convert_tokens_to_ids("<|endoftext|>")  # from generation_config.json
    assert set(first.params.stop_token_ids) == {im_end, eot}
    assert (first.params.temperature, first.params.top_p, first.params.top_k) == (0.7, 0.9, 5)
    assert first.params.max_new_tokens == 64 and first.session_id == "ep-7" and second.session_id == "ep-7"
    assert first.params.seed != second.params.seed
    used = len(second.input_ids) - len(first.input_ids)
    assert second.params.max_new_tokens == min(64, 500 - used)


async def test_max_turns(tiny_tokenizer, registry):
    loop, _, task = make(tiny_tokenizer, registry, [model_turn("", [("add", {"a": 1, "b": 1})])] * 2,
                         max_assistant_turns=2)
    episode = await loop.run(task)
    assert episode.finish_reason == "max_turns" and episode.num_turns == 2
    assert [c["turn"] for c in episode.tool_calls] == [0]


async def test_response_budget_caps_the_next_turn_and_stops(tiny_tokenizer, registry):
    script = [model_turn("", [("add", {"a": 1, "b": 1})]), "x " * 200]
    loop, engine, task = make(tiny_tokenizer, registry, script, max_response_tokens=80)
    episode = await loop.run(task)
    assert len(episode.response_ids) == 80
    assert (episode.finish_reason, episode.metrics["stop_detail"]) == ("length", "response_budget")
    assert engine.calls[1].params.max_new_tokens == 80 - (len(engine.calls[1].input_ids) - len(episode.prompt_ids))
    assert_aligned(episode)


async def test_context_window_caps_the_turn(tiny_tokenizer, registry):
    loop, engine, task = make(tiny_tokenizer, registry, ["y " * 200])
    prompt_len = len(loop._template(None).prompt_ids(PROMPT))
    loop.max_model_len = prompt_len + 30
    episode = await loop.run(task)
    assert len(episode.prompt_ids) + len(episode.response_ids) == prompt_len + 30
    assert (episode.finish_reason, episode.metrics["stop_detail"]) == ("length", "context_window")


async def test_turn_cut_by_length_runs_no_calls(tiny_tokenizer, registry):
    text = model_turn("", [("add", {"a": 1, "b": 1})]) + " and then more text" * 20
    loop, _, task = make(tiny_tokenizer, registry, [text], max_new_tokens_per_turn=40)
    episode = await loop.run(task)
    assert (episode.finish_reason, episode.metrics["stop_detail"]) == ("length", "turn_length")
    assert episode.tool_calls == [] and episode.metrics["tool_calls"] == 0
    assert sum(episode.response_mask) == 40 and episode.messages[-1]["role"] == "assistant"


async def test_observation_that_overflows_the_budget_is_not_appended(tiny_tokenizer, registry):
    script = [model_turn("", [("repeat", {"text": "word", "times": 200})]), "never reached"]
    loop, engine, task = make(tiny_tokenizer, registry, script, max_response_tokens=120,
                              max_tool_response_tokens=1000)
    episode = await loop.run(task)
    assert (episode.finish_reason, episode.metrics["stop_detail"]) == ("length", "observation_overflow")
    assert len(engine.calls) == 1 and episode.tool_calls[0]["ok"]  # the tool ran ...
    assert episode.messages[-1]["role"] == "assistant"  # ... but its output was not appended
    assert episode.response_mask == [1] * len(episode.response_ids)


async def test_malformed_unknown_and_invalid_calls_become_error_observations(tiny_tokenizer, registry):
    turn = ("Trying.\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1,}}\n</tool_call>"
            + tool_call("nope", {}) + tool_call("add", {"a": "x", "b": 2}) + tool_call("lookup", {"entity": "Zed"}))
    loop, _, task = make(tiny_tokenizer, registry, [turn, "Sorry."])
    episode = await loop.run(task)
    assert episode.finish_reason == "stop" and not episode.infra_error
    kinds = [c["error_kind"] for c in episode.tool_calls]
    assert kinds == ["malformed_call", "unknown_tool", "bad_arguments", "tool_error"]
    m = episode.metrics
    assert m["tool_errors"] == 4 and m["tool_error_malformed_call"] == 1 and m["tool_error_unknown_tool"] == 1
    assert m["tool_error_bad_arguments"] == 1 and m["tool_error_tool_error"] == 1
    observations = [msg["content"] for msg in episode.messages if msg["role"] == "tool"]
    assert "invalid JSON" in observations[0] and "<tool_call>" in observations[0]
    assert "unknown tool 'nope'" in observations[1] and "add" in observations[1]
    assert "bad arguments" in observations[2]
    assert "no entity named 'Zed'" in observations[3]
    assistant = episode.messages[1]
    assert [c["function"]["name"] for c in assistant["tool_calls"]] == ["nope", "add", "lookup"]
    assert "{\"a\": 1,}" in assistant["content"]  # the malformed block stays in the transcript as text


async def test_task_tool_subset_hides_other_tools(tiny_tokenizer, registry):
    loop, _, task = make(tiny_tokenizer, registry, [model_turn("", [("add", {"a": 1, "b": 2})]), "ok"],
                         task_tools=["echo"])
    episode = await loop.run(task)
    assert episode.tool_calls[0]["error_kind"] == "unknown_tool"
    assert "Available tools: echo." in episode.messages[2]["content"]


async def test_calls_inside_think_do_not_run(tiny_tokenizer, registry):
    turn = "<think>I could " + model_turn("", [("add", {"a": 2, "b": 2})]) + " but no.</think>It is 4."
    loop, _, task = make(tiny_tokenizer, registry, [turn])
    episode = await loop.run(task)
    assert episode.finish_reason == "stop" and episode.tool_calls == []


async def test_parallel_calls_run_concurrently_and_extra_calls_are_refused(tiny_tokenizer):
    meet = Rendezvous(parties=2)
    registry = ToolRegistry.from_functions([meet.make()])
    calls = [("meet", {"tag": "a"}), ("meet", {"tag": "b"}), ("meet", {"tag": "c"})]
    loop, _, task = make(tiny_tokenizer, registry, [model_turn("", calls), "done"], max_parallel_calls=2)
    episode = await loop.run(task)
    observations = [m["content"] for m in episode.messages if m["role"] == "tool"]
    assert observations[:2] == ["a: met", "b: met"]  # both were in flight at once
    assert "at most 2 tool calls" in observations[2]
    assert episode.tool_calls[2]["error_kind"] == "too_many_calls" and meet.arrived == 2


async def test_tool_service_down_ends_episode_as_infra_error(tiny_tokenizer, registry):
    turn = model_turn("", [("add", {"a": 1, "b": 1}), ("broken_service", {"query": "q"})])
    loop, engine, task = make(tiny_tokenizer, registry, [turn, "never"])
    episode = await loop.run(task)
    assert (episode.finish_reason, episode.infra_error) == ("infra_error", True)
    assert episode.metrics["stop_detail"] == "tool_infra_error" and "unreachable" in episode.metrics["infra_detail"]
    assert len(engine.calls) == 1 and [c["error_kind"] for c in episode.tool_calls] == [None, "unreachable"]
    assert_aligned(episode)


@pytest.mark.parametrize("error,turn,detail,infra", [
    (EngineError("server down"), 1, "engine_error", True),
    (PromptTooLongError("prompt 5000 > 4096"), 0, "prompt_too_long", True),
    (PromptTooLongError("prompt 5000 > 4096"), 1, "context_window", False),
])
async def test_engine_errors(tiny_tokenizer, registry, error, turn, detail, infra):
    script = [model_turn("", [("add", {"a": 1, "b": 1})]), error] if turn else [error]
    loop, _, task = make(tiny_tokenizer, registry, script)
    episode = await loop.run(task)
    assert episode.infra_error is infra and episode.metrics["stop_detail"] == detail
    assert episode.finish_reason == ("infra_error" if infra else "length")
    assert_aligned(episode)


async def test_aborted_generation_is_infra_error(tiny_tokenizer, registry):
    loop, _, task = make(tiny_tokenizer, registry, [Generation(token_ids=[5], logprobs=[-0.1], finish_reason="abort")])
    episode = await loop.run(task)
    assert (episode.finish_reason, episode.infra_error) == ("infra_error", True)
    assert episode.response_ids == []


async def test_eos_other_than_end_of_turn_ends_the_episode(tiny_tokenizer, registry):
    eos = tiny_tokenizer.convert_tokens_to_ids("<|endoftext|>")
    ids = tiny_tokenizer.encode(model_turn("", [("add", {"a": 1, "b": 1})]), add_special_tokens=False) + [eos]
    gen = Generation(token_ids=ids, logprobs=[-0.5] * len(ids), finish_reason="stop")
    loop, _, task = make(tiny_tokenizer, registry, [gen])
    episode = await loop.run(task)
    assert (episode.finish_reason, episode.metrics["stop_detail"]) == ("stop", "eos")
    assert episode.tool_calls == []


@pytest.mark.parametrize("as_infra", [True, False])
async def test_episode_timeout_keeps_partial_episode(tiny_tokenizer, registry, as_infra):
    script = [model_turn("", [("slow", {"seconds": 30})]), "never"]
    loop, _, task = make(tiny_tokenizer, registry, script, episode_timeout_s=0.3, timeout_is_infra_error=as_infra)
    episode = await loop.run(task)
    assert (episode.finish_reason, episode.infra_error) == ("timeout", as_infra)
    assert episode.metrics["timeout_phase"] == "tools" and episode.metrics["tool_s"] > 0.0
    assert episode.num_turns == 1 and sum(episode.response_mask) == len(episode.response_ids)
    assert episode.messages[-1]["role"] == "assistant"
    assert_aligned(episode)


async def test_engine_without_session_id_parameter(tiny_tokenizer, registry):
    class Plain:
        def __init__(self):
            self.inner = ScriptedEngine(tiny_tokenizer, ["hi"])

        async def generate(self, input_ids, params):
            return await self.inner.generate(input_ids, params)

    loop = ToolAgentLoop(Plain(), tiny_tokenizer, registry, AgentLoopConfig())
    episode = await loop.run(Task(prompt=PROMPT))
    assert episode.finish_reason == "stop"


async def test_no_tool_registry(tiny_tokenizer):
    loop, _, task = make(tiny_tokenizer, None, [model_turn("", [("add", {"a": 1, "b": 1})]), "4"])
    episode = await loop.run(task)
    assert episode.tool_calls[0]["error_kind"] == "unknown_tool" and "none" in episode.messages[2]["content"]


async def test_prompt_longer_than_the_context_window_is_infra_error(tiny_tokenizer, registry):
    loop, engine, task = make(tiny_tokenizer, registry, ["never"], max_model_len=10)
    episode = await loop.run(task)
    assert (episode.finish_reason, episode.metrics["stop_detail"]) == ("infra_error", "prompt_too_long")
    assert episode.infra_error and engine.calls == []


async def test_the_replay_record_names_a_local_model_by_its_absolute_path(tiny_tokenizer, registry, tmp_path,
                                                                           monkeypatch):
    """`agentrl replay` reads the recorded model from any directory, not only from where the run started."""
    (tmp_path / "runs" / "tiny-model").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    loop, engine, task = make(tiny_tokenizer, registry, ["<answer>4</answer>", "<answer>4</answer>"])
    engine.model_path = "runs/tiny-model"
    episode = await loop.run(task)
    assert episode.replay["engine"]["model"] == str(tmp_path / "runs" / "tiny-model")
    engine.model_path = "Qwen/Qwen2.5-3B-Instruct"  # a Hugging Face id (an SGLang server's model) stays as it is
    assert (await loop.run(task)).replay["engine"]["model"] == "Qwen/Qwen2.5-3B-Instruct"
