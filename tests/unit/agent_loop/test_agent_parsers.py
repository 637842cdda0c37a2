from __future__ import annotations

import pytest

from agentrl.agent_loop.parsers import HermesParser, make_parser

CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'


def test_plain_text_has_no_calls():
    parsed = HermesParser().parse("The answer is 3.")
    assert parsed.calls == [] and parsed.content == "The answer is 3."


def test_content_then_several_calls():
    text = "Let me add.\n" + CALL + "\n" + CALL.replace("add", "mul")
    parsed = HermesParser().parse(text)
    assert [(c.name, c.arguments, c.error) for c in parsed.calls] == [("add", {"a": 1, "b": 2}, None),
                                                                       ("mul", {"a": 1, "b": 2}, None)]
    assert parsed.content == "Let me add."


def test_call_only_turn_has_empty_content():
    assert HermesParser().parse(CALL).content == ""


def test_arguments_as_json_string_and_missing_arguments():
    parsed = HermesParser().parse('<tool_call>{"name": "f", "arguments": "{\\"x\\": 2}"}</tool_call>'
                                  '<tool_call>{"name": "g"}</tool_call>')
    assert [(c.name, c.arguments, c.error) for c in parsed.calls] == [("f", {"x": 2}, None), ("g", {}, None)]


@pytest.mark.parametrize("body,message", [
    ('{"name": "add", "arguments": {"a": 1,}}', "invalid JSON"),
    ('["add"]', "JSON object"),
    ('{"arguments": {}}', '"name"'),
    ('{"name": "add", "arguments": [1]}', '"arguments" must be a JSON object'),
    ('{"name": "add", "arguments": "{nope"}', '"arguments" string is not valid JSON'),
])
def test_malformed_blocks_are_reported_and_kept_in_content(body, message):
    text = f"Try.\n<tool_call>{body}</tool_call>"
    parsed = HermesParser().parse(text)
    (call,) = parsed.calls
    assert message in call.error
    assert parsed.content == text  # the template cannot re-render a malformed call: keep it as text


def test_unclosed_call_is_malformed():
    parsed = HermesParser().parse(CALL + '\n<tool_call>\n{"name": "add", "argu')
    assert [c.error is None for c in parsed.calls] == [True, False]
    assert "never closed" in parsed.calls[1].error


def test_calls_inside_think_are_ignored_even_if_unbalanced():
    text = "<think>maybe <tool_call> hmm</think>\n" + CALL
    parsed = HermesParser().parse(text)
    assert [c.name for c in parsed.calls] == ["add"]
    assert HermesParser().parse("<think>" + CALL + "</think>Final.").calls == []
    assert HermesParser().parse("<think>still thinking " + CALL).calls == []  # unclosed think runs to the end


def test_unknown_parser_name():
    with pytest.raises(ValueError, match="hermes"):
        make_parser("qwen3_coder")


def test_think_opened_by_the_generation_prompt():
    # Qwen3-style prompts end with "<think>\n": the model's text holds only the closing tag
    parsed = HermesParser().parse("maybe " + CALL + "\n</think>\n\n" + CALL.replace("add", "mul"))
    assert [c.name for c in parsed.calls] == ["mul"]
    assert parsed.content.startswith("maybe <tool_call>")
