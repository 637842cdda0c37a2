"""ChatTemplate's memos: faster, and never a different text or id."""

from __future__ import annotations

import copy
import json

import pytest

from agentrl.agent_loop.chat import _LRU, _MISSING, ChatTemplate, _freeze, _Unfreezable

TOOLS = [
    {"type": "function", "function": {
        "name": "calculator", "description": "Evaluate an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string", "description": "e.g. 1+2"}},
                       "required": ["expression"]}}},
    {"type": "function", "function": {
        "name": "lookup", "description": "Look up an entity: «Zürich», 東京, 🙂.",
        "parameters": {"type": "object", "properties": {"entity": {"type": "string"}}, "required": ["entity"]}}},
]


def _call(name: str, arguments, call_id: str = "call_0_0") -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


CONVERSATIONS = [
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "Use the tools."}, {"role": "user", "content": "What is 81 * 6023 + 8752?"}],
    [{"role": "system", "content": "Use the tools."}, {"role": "user", "content": "What is 81 * 6023 + 8752?"},
     {"role": "assistant", "content": "", "tool_calls": [_call("calculator", {"expression": "81 * 6023 + 8752"})]},
     {"role": "tool", "tool_call_id": "call_0_0", "name": "calculator", "content": "496615"}],
    [{"role": "user", "content": "Wer ist «Zürich»? 東京 と 🙂 e\u0301 \u00a0 tabs\t\tand\n\n\nnewlines"},
     {"role": "assistant", "content": "Let me look.", "tool_calls": [
         _call("lookup", {"entity": "Zürich", "limit": 3, "exact": True, "score": 0.5, "tags": ["a", None]}),
         _call("calculator", {"expression": "2 ** 10"}, "call_0_1")]},
     {"role": "tool", "tool_call_id": "call_0_0", "name": "lookup", "content": "Zürich: a city.\n<b>x</b>"},
     {"role": "tool", "tool_call_id": "call_0_1", "name": "calculator", "content": "1024"},
     {"role": "assistant", "content": "<answer>1024</answer>"}],
    [{"role": "user", "content": "q"}, {"role": "assistant", "content": "<tool_call>\n{bad json\n</tool_call>"},
     {"role": "tool", "content": "Error: malformed call."}, {"role": "user", "content": "Try again."}],
]


def _plain(tokenizer, messages, gen: bool, tools=TOOLS) -> str:
    from agentrl.agent_loop.chat import canonical_tools

    return tokenizer.apply_chat_template(messages, tools=canonical_tools(tools), tokenize=False,
                                         add_generation_prompt=gen)


def test_memoised_render_is_the_plain_render(tokenizer):
    template = ChatTemplate(tokenizer, TOOLS)
    for _ in range(2):  # the second pass is served by the memo
        for conversation in CONVERSATIONS:
            for gen in (False, True):
                assert template.render(conversation, add_generation_prompt=gen) == _plain(tokenizer, conversation,
                                                                                           gen)
    assert template._renders.hits >= 2 * len(CONVERSATIONS)


def test_a_message_changed_after_its_render_is_rendered_anew(qwen2_tokenizer):
    template = ChatTemplate(qwen2_tokenizer, TOOLS)
    messages = copy.deepcopy(CONVERSATIONS[3])
    seen = {template.render(messages)}
    arguments = messages[1]["tool_calls"][0]["function"]["arguments"]
    changes = [
        lambda: messages[0].update(content=messages[0]["content"] + "!"),  # same dict, new content
        lambda: messages[1]["tool_calls"][0]["function"].update(  # the same arguments, other key order
            arguments={k: arguments[k] for k in reversed(list(arguments))}),
        lambda: messages[1]["tool_calls"][0]["function"]["arguments"].update(limit=3.0),  # 3 -> 3.0
        lambda: messages[1]["tool_calls"][0]["function"]["arguments"].update(limit=True),  # 3.0 -> True
        lambda: messages[1]["tool_calls"][0]["function"]["arguments"].update(score=-0.0),
        lambda: messages[1]["tool_calls"][0]["function"]["arguments"].update(score=0.0),
        lambda: messages[2].update(content="1"),
        lambda: messages[2].update(content=1),  # the str "1" vs the int 1
        lambda: messages.append({"role": "user", "content": "more"}),
        lambda: messages.pop(),
    ]
    for change in changes:
        change()
        for gen in (False, True):
            text = template.render(messages, add_generation_prompt=gen)
            assert text == _plain(qwen2_tokenizer, messages, gen)
        seen.add(template.render(messages))
    # the first render and every change show in the text, except two: content 1 renders like content "1" (the memo
    # keeps them apart all the same), and the last pop comes back to a conversation already rendered
    assert len(seen) == 1 + len(changes) - 2


def test_values_without_an_exact_image_are_rendered_without_the_memo(qwen2_tokenizer):
    template = ChatTemplate(qwen2_tokenizer, TOOLS)
    kept = len(template._renders)
    odd = [[{"role": "user", "content": "hi", "extra": (1, 2)}],  # a tuple renders like a list in tojson only
           [{"role": "assistant", "content": "", "tool_calls": [_call("lookup", {1: "x"})]}],  # a non-str key
           [{"role": "user", "content": type("Text", (str,), {})("hi")}]]  # a str subclass
    for messages in odd:
        assert template.render(messages) == _plain(qwen2_tokenizer, messages, False)
    assert len(template._renders) == kept
    for value in ((1,), {1: 2}, {"a": object()}, type("S", (str,), {})("x"), b"x"):
        with pytest.raises(_Unfreezable):
            _freeze(value)


def test_images_keep_types_values_and_key_order_apart():
    values = [1, 1.0, True, "1", None, "None", 0.0, -0.0, float("nan"), [1], ["1"], {"a": 1, "b": 2},
              {"b": 2, "a": 1}, {"a": [1, {"b": None}]}, {"a": [1, {"b": "None"}]}, [], {}, "", [[]], [{}]]
    images = [_freeze(v) for v in values]
    assert len({repr(i) for i in images}) == len(values)
    for i, a in enumerate(images):
        for j, b in enumerate(images):
            assert (a == b) == (i == j), (values[i], values[j])
    assert _freeze(json.loads(json.dumps(values))) == _freeze(values[:8] + [json.loads("NaN")] + values[9:])


def test_prompt_ids_are_memoised_and_returned_as_fresh_lists(tokenizer):
    template = ChatTemplate(tokenizer, TOOLS)
    prompt = CONVERSATIONS[1]
    first = template.prompt_ids(prompt)
    assert first == list(tokenizer.encode(_plain(tokenizer, prompt, True), add_special_tokens=False))
    first.append(-1)
    second = template.prompt_ids(copy.deepcopy(prompt))
    assert second == first[:-1] and second is not template.prompt_ids(prompt)
    assert template._prompts.hits == 2 and template._prompts.misses == 1


def test_the_memos_are_bounded(qwen2_tokenizer):
    class Small(ChatTemplate):
        RENDER_MEMO_ENTRIES = 8
        PROMPT_MEMO_ENTRIES = 4

    template = Small(qwen2_tokenizer, TOOLS)
    for i in range(50):
        messages = [{"role": "user", "content": f"question {i}"}]
        assert template.prompt_ids(messages) == list(qwen2_tokenizer.encode(
            _plain(qwen2_tokenizer, messages, True), add_special_tokens=False))
        assert len(template._renders) <= 8 and len(template._prompts) <= 4
    lru = _LRU(max_entries=100, max_size=10)
    for i in range(20):
        lru.put(i, "x" * 3, 3)
        assert lru._size <= 10 and len(lru) <= 3
    lru.put("big", "x" * 11, 11)  # larger than the whole memo: not kept
    assert lru.get("big") is _MISSING and "big" not in lru._items
    assert [lru.get(k) for k in (19, 18, 17)] == ["xxx"] * 3
    lru.put(20, "yy", 2)  # over the size bound: evicts the least recently used (19 was used first above)
    assert 19 not in lru._items and 17 in lru._items


def test_a_template_reading_the_clock_is_not_memoised(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    plain = tok.chat_template
    tok.chat_template = "{% set today = strftime_now('%Y') %}" + plain
    template = ChatTemplate(tok, TOOLS)
    template.render(CONVERSATIONS[0])
    assert len(template._renders) == 0
    tok.chat_template = "{{ range(10) | random }}" + plain
    assert ChatTemplate(tok, TOOLS).render(CONVERSATIONS[0])[0].isdigit()
    assert len(ChatTemplate(tok, TOOLS)._renders) == 0
    tok.chat_template = plain
    template = ChatTemplate(tok, TOOLS)
    before = len(template._renders)
    template.render(CONVERSATIONS[0])
    assert len(template._renders) == before + 1
