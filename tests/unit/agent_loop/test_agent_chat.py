"""ChatTemplate: end-of-turn detection, the glue between turns, and templates that are not append-only."""

from __future__ import annotations

import pytest
from scripted_engine import ScriptedEngine, model_turn

from agentrl.agent_loop import AgentLoopConfig, ToolAgentLoop
from agentrl.agent_loop.chat import ChatTemplate, TemplateError
from agentrl.types import Task

# Qwen3-like: the <think> part of an assistant turn is dropped once the turn is no longer the last message.
DROPS_PAST_THINKING = """
{%- for m in messages -%}
{%- if m.role == 'assistant' -%}
{%- set c = m.content -%}
{%- if not loop.last and '</think>' in c -%}{%- set c = c.split('</think>')[-1] -%}{%- endif -%}
{{- '<|im_start|>assistant\\n' + c -}}
{%- for tc in m.tool_calls or [] -%}
{{- '\\n<tool_call>\\n{"name": "' + tc.function.name + '", "arguments": '
    + (tc.function.arguments | tojson) + '}\\n</tool_call>' -}}
{%- endfor -%}
{{- '<|im_end|>\\n' -}}
{%- elif m.role == 'tool' -%}
{{- '<|im_start|>user\\n<tool_response>\\n' + m.content + '\\n</tool_response><|im_end|>\\n' -}}
{%- else -%}
{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}
"""
# Rewrites its first line whenever a message is added: no base conversation can make it append-only.
COUNTS_MESSAGES = "{{ messages | length }} messages\n" + DROPS_PAST_THINKING


@pytest.fixture
def fresh_tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_end_of_turn_is_im_end(tokenizer):
    template = ChatTemplate(tokenizer)
    assert template.end_of_turn == "<|im_end|>"
    assert template.end_of_turn_id == tokenizer.convert_tokens_to_ids("<|im_end|>")


def test_prompt_ids_end_with_generation_prompt(tokenizer):
    ids = ChatTemplate(tokenizer).prompt_ids([{"role": "user", "content": "hi"}])
    assert tokenizer.decode(ids).endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


async def test_template_that_drops_past_thinking_uses_the_minimal_base(fresh_tokenizer, registry):
    fresh_tokenizer.chat_template = DROPS_PAST_THINKING
    script = [model_turn("<think>I should add.</think>Adding.", [("add", {"a": 1, "b": 2})]), "3"]
    engine = ScriptedEngine(fresh_tokenizer, script)
    loop = ToolAgentLoop(engine, fresh_tokenizer, registry, AgentLoopConfig())
    episode = await loop.run(Task(prompt=[{"role": "user", "content": "1+2?"}]))
    assert episode.finish_reason == "stop" and episode.metrics["template_minimal_base"] == 1
    assert "template_full" not in episode.metrics
    full = episode.prompt_ids + episode.response_ids
    first, second = engine.calls
    assert second.input_ids == full[:len(second.input_ids)]  # the model saw its own thinking, unchanged
    assert "<think>I should add.</think>" in fresh_tokenizer.decode(second.input_ids)
    glue = second.input_ids[len(first.input_ids) + len(first.output.token_ids):]
    assert fresh_tokenizer.decode(glue) == ("\n<|im_start|>user\n<tool_response>\n3\n</tool_response><|im_end|>\n"
                                            "<|im_start|>assistant\n")
    sampled = [m for m in episode.response_mask if m]
    assert len(sampled) == len(first.output.token_ids) + len(second.output.token_ids)


def test_template_that_is_never_append_only_fails_loudly(fresh_tokenizer):
    fresh_tokenizer.chat_template = COUNTS_MESSAGES
    template = ChatTemplate(fresh_tokenizer)
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    with pytest.raises(TemplateError, match="not append-only"):
        template.delta_ids(messages, [{"role": "tool", "content": "r"}])


def test_template_without_a_special_end_of_turn_is_rejected(fresh_tokenizer):
    fresh_tokenizer.chat_template = ("{% for m in messages %}### {{ m.role }}: {{ m.content }}\n{% endfor %}"
                                     "{% if add_generation_prompt %}### assistant: {% endif %}")
    with pytest.raises(TemplateError, match="end of a model turn cannot be detected"):
        ChatTemplate(fresh_tokenizer)


def test_turn_by_turn_ids_equal_the_whole_rendering(tokenizer):
    assert ChatTemplate(tokenizer).boundary_problem() is None


def test_boundary_problem_is_reported(fresh_tokenizer):
    # the generation prompt lacks the "\n" that rendered assistant turns have
    fresh_tokenizer.chat_template = DROPS_PAST_THINKING.replace("{{- '<|im_start|>assistant\\n' -}}{%- endif",
                                                                "{{- '<|im_start|>assistant' -}}{%- endif")
    assert "differ" in ChatTemplate(fresh_tokenizer).boundary_problem()


SCHEMA = {"type": "function", "function": {
    "name": "search", "description": "Search the index.",
    "parameters": {"type": "object", "properties": {
        "query": {"type": "string", "description": "what to find"},
        "filters": {"type": "array", "items": {"type": "object", "properties": {"field": {"type": "string"},
                                                                                "value": {"type": "string"}}}},
        "mode": {"anyOf": [{"type": "string", "enum": ["fast", "exact"]}, {"type": "null"}], "default": None}},
        "required": ["query"]}}}
OTHER = {"type": "function", "function": {"name": "add", "description": "Add.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}


def _reversed_keys(node):
    """The same JSON value with every object's keys in reverse order (lists keep their order)."""
    if isinstance(node, dict):
        return {k: _reversed_keys(node[k]) for k in reversed(list(node))}
    if isinstance(node, list):
        return [_reversed_keys(x) for x in node]
    return node


def test_canonical_tools_fix_one_key_order_whatever_the_source():
    import json

    from agentrl.agent_loop.chat import canonical_tools

    canon = canonical_tools([SCHEMA, OTHER])
    # sorted keys (a JSONL file written with sort_keys), reversed keys, another tool order: one result
    for variant in ([json.loads(json.dumps(SCHEMA, sort_keys=True)), OTHER], [_reversed_keys(OTHER),
                                                                              _reversed_keys(SCHEMA)]):
        assert json.dumps(canonical_tools(variant)) == json.dumps(canon)
    add, search = canon  # tools sorted by name
    assert list(add) == ["type", "function"] and list(add["function"]) == ["name", "description", "parameters"]
    params = search["function"]["parameters"]
    assert list(params) == ["type", "properties", "required"]
    assert list(params["properties"]) == ["filters", "mode", "query"]  # argument names sorted
    assert list(params["properties"]["query"]) == ["type", "description"]
    item = params["properties"]["filters"]["items"]
    assert list(item) == ["type", "properties"] and list(item["properties"]) == ["field", "value"]
    assert list(params["properties"]["mode"]) == ["anyOf", "default"]
    assert list(params["properties"]["mode"]["anyOf"][0]) == ["type", "enum"]
    assert params["required"] == ["query"] and SCHEMA["function"]["parameters"]["properties"]["query"] == {
        "type": "string", "description": "what to find"}  # input untouched
    assert canonical_tools(None) is None and canonical_tools([]) is None


@pytest.mark.parametrize("which", ["tiny", "qwen2"])
def test_prompt_tokens_do_not_depend_on_the_schema_key_order(which, tiny_model_dir, qwen2_tokenizer_dir):
    import json

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir if which == "tiny" else qwen2_tokenizer_dir)
    question = [{"role": "user", "content": "Find cats."}]
    ids = ChatTemplate(tok, [SCHEMA, OTHER]).prompt_ids(question)
    assert ChatTemplate(tok, [json.loads(json.dumps(s, sort_keys=True)) for s in (OTHER, SCHEMA)]).prompt_ids(
        question) == ids
    text = tok.decode(ids)
    assert text.index('"name": "add"') < text.index('"name": "search"')
    assert '{"type": "function", "function": {"name": "search", "description": "Search the index.", ' in text


@pytest.mark.parametrize("suite", ["calc", "lookup"])
def test_sft_demonstration_prompt_is_the_rollout_prompt(suite, tiny_tokenizer, tmp_path):
    """The tokens SFT trains a demonstration on begin with exactly the prompt a rollout of its task sends the
    engine. (The demonstration file is written with sorted keys; before the schemas were put in one order, the
    tool list in an SFT prompt read `{"function": {"description": ..., "name": ...}, "type": "function"}` while
    rollouts showed `{"type": "function", "function": {"name": ...}}`.)"""
    import asyncio
    import json

    from agentrl.data.demos import load_demos, tokenize_demos
    from agentrl.data.suites.demos import demo_tools, write_demos

    demos = tmp_path / "demos.jsonl"
    write_demos(suite, 2, demos, seed=3)
    rows = load_demos([str(demos)])
    ids, mask = tokenize_demos(tiny_tokenizer, rows, max_length=4096)[0][0]
    task = json.loads((tmp_path / "demos.tasks.jsonl").read_text().splitlines()[0])
    engine = ScriptedEngine(tiny_tokenizer, ["<answer>0</answer>"])

    async def rollout():
        registry = demo_tools()
        try:
            loop = ToolAgentLoop(engine, tiny_tokenizer, registry, AgentLoopConfig())
            await loop.run(Task(prompt=task["prompt"], tools=task["tools"],
                                tools_kwargs=task.get("tools_kwargs") or None), uid="g0")
        finally:
            await registry.aclose()

    asyncio.run(rollout())
    prompt = engine.calls[0].input_ids
    assert ids[:len(prompt)] == prompt
    assert mask[len(prompt) - 1] == 0 and mask[len(prompt)] == 1  # training starts at the first model token
