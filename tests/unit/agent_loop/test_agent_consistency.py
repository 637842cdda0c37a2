"""The consistency invariant, with the tiny tokenizer and the real Qwen2 tokenizer + Qwen2.5 tool template:

- prompt_ids + response_ids equals apply_chat_template(final transcript) token for token (followed only by the
  template's "\\n" after the last <|im_end|>, which no model turn samples);
- response_mask is 1 exactly on the tokens the engine returned, with exactly their logprobs; 0 / 0.0 elsewhere;
- each engine call saw a prefix of the final sequence (nothing appended is ever rewritten).
"""

from __future__ import annotations

import pytest
from scripted_engine import ScriptedEngine, model_turn

from agentrl.agent_loop import AgentLoopConfig, ToolAgentLoop
from agentrl.agent_loop.chat import canonical_tools
from agentrl.types import Task

QUESTION = [{"role": "system", "content": "Use the tools."}, {"role": "user", "content": "What is 1+2? Ünïcödé 世界"}]


def assert_consistent(episode, engine: ScriptedEngine, tokenizer, schemas) -> None:
    episode.check()
    full = episode.prompt_ids + episode.response_ids
    text = tokenizer.apply_chat_template(episode.messages, tools=canonical_tools(schemas), tokenize=False)
    rendered = tokenizer.encode(text, add_special_tokens=False)
    assert rendered[:len(full)] == full, _first_difference(full, rendered, tokenizer)
    assert tokenizer.decode(rendered[len(full):]) == "\n"

    expected_mask = [0] * len(full)
    expected_logprobs = [0.0] * len(full)
    for call in engine.calls:
        start = len(call.input_ids)
        assert full[:start] == call.input_ids, "an engine call saw tokens that were later rewritten"
        out = call.output
        assert full[start:start + len(out.token_ids)] == out.token_ids
        for i, lp in enumerate(out.logprobs):
            expected_mask[start + i] = 1
            expected_logprobs[start + i] = lp
    p = len(episode.prompt_ids)
    assert episode.response_mask == expected_mask[p:]
    assert episode.response_logprobs == expected_logprobs[p:]
    turns = [t for t, m in zip(episode.turn_ids, episode.response_mask) if m == 1]
    assert turns == sorted(turns) and set(turns) == set(range(episode.num_turns))
    assert all(t == -1 for t, m in zip(episode.turn_ids, episode.response_mask) if m == 0)


def _first_difference(a: list[int], b: list[int], tokenizer) -> str:
    i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return (f"token {i}: episode {tokenizer.decode(a[max(0, i - 5):i + 5])!r} vs template "
            f"{tokenizer.decode(b[max(0, i - 5):i + 5])!r}")


async def _run(tokenizer, registry, script, **config):
    engine = ScriptedEngine(tokenizer, script)
    loop = ToolAgentLoop(engine, tokenizer, registry, AgentLoopConfig(**config))
    episode = await loop.run(Task(prompt=QUESTION, tools=["add", "echo", "repeat"]), uid="g0")
    return episode, engine


async def test_parallel_calls_consecutive_tool_messages_empty_content_unicode(tokenizer, registry):
    script = [
        model_turn("Let me compute.", [("add", {"a": 1, "b": 2}), ("echo", {"text": "héllo 世界 ✓"})]),
        model_turn("", [("echo", {"text": ""})]),  # empty content, empty observation
        model_turn("", [("echo", {"text": "a"}), ("echo", {"text": "b"}), ("add", {"a": -5, "b": 7})]),
        "The answer is <answer>3</answer>",
    ]
    episode, engine = await _run(tokenizer, registry, script)
    assert episode.finish_reason == "stop" and episode.num_turns == 4
    assert [c["name"] for c in episode.tool_calls] == ["add", "echo", "echo", "echo", "echo", "add"]
    assert all(c["ok"] for c in episode.tool_calls)
    tool_msgs = [m["content"] for m in episode.messages if m["role"] == "tool"]
    assert tool_msgs == ["3", "héllo 世界 ✓", "", "a", "b", "2"]
    assert episode.metrics["template_full"] == 3
    assert_consistent(episode, engine, tokenizer, registry.schemas(["add", "echo", "repeat"]))


async def test_long_observation_is_truncated_and_stays_consistent(tokenizer, registry):
    script = [model_turn("Repeat it.", [("repeat", {"text": "ünïcode ✓ value", "times": 300})]), "Done."]
    episode, engine = await _run(tokenizer, registry, script, max_tool_response_tokens=40)
    (record,) = episode.tool_calls
    assert record["truncated"] is True and episode.metrics["truncated_observations"] == 1
    observation = next(m["content"] for m in episode.messages if m["role"] == "tool")
    assert "truncated" in observation and len(tokenizer.encode(observation, add_special_tokens=False)) <= 44
    assert_consistent(episode, engine, tokenizer, registry.schemas(["add", "echo", "repeat"]))


async def test_episode_ending_on_max_turns_with_pending_calls_is_consistent(tokenizer, registry):
    script = [model_turn("Step.", [("add", {"a": 1, "b": 1})])] * 3
    episode, engine = await _run(tokenizer, registry, script, max_assistant_turns=3)
    assert episode.finish_reason == "max_turns" and episode.num_turns == 3
    assert len(episode.tool_calls) == 2  # the last turn's call is not run
    assert episode.messages[-1]["role"] == "assistant" and episode.messages[-1]["tool_calls"]
    assert_consistent(episode, engine, tokenizer, registry.schemas(["add", "echo", "repeat"]))


async def test_error_observations_are_consistent(tokenizer, registry):
    script = [
        model_turn("Try.", [("nope", {"x": 1}), ("add", {"a": "one"})]),
        "I give up.",
    ]
    episode, engine = await _run(tokenizer, registry, script)
    kinds = [c["error_kind"] for c in episode.tool_calls]
    assert kinds == ["unknown_tool", "bad_arguments"]
    assert_consistent(episode, engine, tokenizer, registry.schemas(["add", "echo", "repeat"]))


@pytest.mark.parametrize("which", ["tiny", "qwen2"])
def test_glue_after_tool_turn_includes_newline_after_im_end(which, request, registry):
    """verl #6501: the "\\n" after <|im_end|> is template glue the model never samples; it must be appended."""
    from agentrl.agent_loop.chat import ChatTemplate

    tokenizer = request.getfixturevalue(f"{which}_tokenizer")
    template = ChatTemplate(tokenizer, registry.schemas(["add"]))
    messages = QUESTION + [{"role": "assistant", "content": "",
                            "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 1}}}]}]
    delta = template.delta_ids(messages, [{"role": "tool", "content": "2"}])
    text = tokenizer.decode(delta.ids)
    assert delta.mode == "full"
    assert text == "\n<|im_start|>user\n<tool_response>\n2\n</tool_response><|im_end|>\n<|im_start|>assistant\n"


async def test_thinking_and_calls_written_while_thinking_are_consistent(tokenizer, registry):
    script = [
        model_turn("<think>Maybe " + model_turn("", [("echo", {"text": "no"})]) + " first? No.</think>Adding.",
                   [("add", {"a": 2, "b": 3})]),
        "<think>5 it is.</think><answer>5</answer>",
    ]
    episode, engine = await _run(tokenizer, registry, script)
    assert [c["name"] for c in episode.tool_calls] == ["add"]  # the call inside <think> did not run
    assert episode.finish_reason == "stop"
    assert_consistent(episode, engine, tokenizer, registry.schemas(["add", "echo", "repeat"]))


# Calls a model can sample that the parser accepts but the template re-renders differently. The first is the
# output that broke tests/integration/agent_loop/test_agent_loop_e2e.py: an extra "\n" before </tool_call>, so at
# that position the episode held "\n" where re-rendering the transcript gave </tool_call>.
NONCANONICAL_TURNS = {
    "extra_newline_before_close":
        'Checking.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n\n</tool_call>',
    "compact_json": 'Checking.\n<tool_call>\n{"name":"add","arguments":{"a":1,"b":2}}\n</tool_call>',
    "arguments_first": 'Checking.\n<tool_call>\n{"arguments": {"a": 1, "b": 2}, "name": "add"}\n</tool_call>',
    "text_after_call": 'Checking.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call> Done?',
    "no_newline_before_open": 'Checking.<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>',
}


@pytest.mark.parametrize("kind", sorted(NONCANONICAL_TURNS))
async def test_noncanonical_call_runs_and_transcript_renders_the_sampled_text(kind, tokenizer, registry):
    script = [NONCANONICAL_TURNS[kind], model_turn("", [("add", {"a": 3, "b": 4})]), "<answer>7</answer>"]
    episode, engine = await _run(tokenizer, registry, script)
    assert [(c["name"], c["ok"]) for c in episode.tool_calls] == [("add", True), ("add", True)]
    assert [m["content"] for m in episode.messages if m["role"] == "tool"] == ["3", "7"]
    first = episode.messages[len(QUESTION)]
    assert first == {"role": "assistant", "content": NONCANONICAL_TURNS[kind]}  # verbatim, so it renders back
    assert episode.messages[len(QUESTION) + 2]["tool_calls"]  # the canonical second call stays structured
    assert episode.metrics["noncanonical_call_turns"] == 1
    assert "noncanonical_token_turns" not in episode.metrics
    assert_consistent(episode, engine, tokenizer, registry.schemas(["add", "echo", "repeat"]))


async def test_canonical_turns_are_not_counted(tokenizer, registry):
    script = [model_turn("Checking.", [("add", {"a": 1, "b": 2})]), "<answer>3</answer>"]
    episode, _ = await _run(tokenizer, registry, script)
    assert "noncanonical_call_turns" not in episode.metrics and "noncanonical_token_turns" not in episode.metrics


async def test_noncanonical_token_split_is_counted(tiny_tokenizer, registry):
    """Ids that are not the tokenizer's encoding of their own text (a sampled split BPE would merge) cannot be
    re-rendered by any transcript; the episode says so instead of claiming consistency."""
    from agentrl.types import Generation

    def split_turn(input_ids, params):
        text = model_turn("Checking.", [("add", {"a": 1, "b": 2})])
        ids = [i for ch in text for i in tiny_tokenizer.encode(ch, add_special_tokens=False)]
        ids.append(tiny_tokenizer.convert_tokens_to_ids("<|im_end|>"))
        return Generation(token_ids=ids, logprobs=[-0.5] * len(ids), finish_reason="stop")

    episode, _ = await _run(tiny_tokenizer, registry, [split_turn, "<answer>3</answer>"])
    assert episode.tool_calls[0]["ok"] and episode.metrics["noncanonical_token_turns"] == 1
