"""Tool-call parsers: the text of one model turn -> (message content, tool calls).

A parser never raises on bad model output: a block it cannot read becomes a `ToolCall` with `error` set, which
the agent loop answers with an error observation the model sees. Registry: `PARSERS` (config `agent.tool_parser`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Protocol

from agentrl.types import ToolCall


@dataclass
class ParsedTurn:
    """`content` is the turn's text without its well-formed call blocks, in the form the chat template re-renders
    (the assistant message's `content`; `tool_calls` are rendered by the template after it)."""

    content: str
    calls: list[ToolCall]


class ToolCallParser(Protocol):
    def parse(self, text: str) -> ParsedTurn: ...


_THINK = re.compile(r"<think>.*?(?:</think>|\Z)", re.DOTALL)
# One optional "\n" before the block belongs to the block: the Qwen/Hermes templates render
# content + "\n<tool_call>\n{...}\n</tool_call>" per call (no "\n" when the content is empty).
_CALL = re.compile(r"\n?<tool_call>(.*?)</tool_call>", re.DOTALL)
_OPEN = "<tool_call>"


def _mask_think(text: str) -> str:
    """`text` with every <think>...</think> block (an unclosed one runs to the end) blanked out, same length,
    so that tags written while reasoning neither count as calls nor pair with tags outside the block. A
    </think> with no <think> before it closes a block the generation prompt opened (Qwen3 templates end the
    prompt with "<think>\n"): everything before it is reasoning too."""
    close, open_ = text.find("</think>"), text.find("<think>")
    if close >= 0 and (open_ < 0 or close < open_):
        end = close + len("</think>")
        text = "\0" * end + text[end:]
    return _THINK.sub(lambda m: "\0" * (m.end() - m.start()), text)


def _decode_call(body: str, raw: str) -> ToolCall:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        return ToolCall(name="", arguments={}, raw=raw, error=f"invalid JSON in <tool_call>: {e.msg} at char {e.pos}")
    if not isinstance(obj, dict):
        return ToolCall(name="", arguments={}, raw=raw,
                        error=f"<tool_call> must hold a JSON object, got {type(obj).__name__}")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return ToolCall(name="", arguments={}, raw=raw, error='<tool_call> object has no "name" string')
    arguments = obj.get("arguments", {})
    if isinstance(arguments, str):  # OpenAI style: arguments as a JSON string
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as e:
            return ToolCall(name=name, arguments={}, raw=raw, error=f'"arguments" string is not valid JSON: {e.msg}')
    if not isinstance(arguments, dict):
        return ToolCall(name=name, arguments={}, raw=raw,
                        error=f'"arguments" must be a JSON object, got {type(arguments).__name__}')
    return ToolCall(name=name, arguments=arguments, raw=raw)


class HermesParser:
    """Hermes / Qwen2.5 format: one or more `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`.

    Blocks inside <think>...</think> are reasoning, not calls (they stay in the content). An unclosed
    <tool_call> outside a think block is reported as a malformed call. Malformed blocks stay in the content
    verbatim (the template cannot render them as tool_calls); well-formed blocks are removed from it.
    """

    def parse(self, text: str) -> ParsedTurn:
        masked = _mask_think(text)
        calls: list[ToolCall] = []
        pieces: list[str] = []
        cursor = 0
        for m in _CALL.finditer(masked):
            start = m.start() + (1 if masked[m.start()] == "\n" else 0)
            call = _decode_call(m.group(1).strip(), raw=text[start:m.end()])
            calls.append(call)
            if call.error is None:
                pieces.append(text[cursor:m.start()])
                cursor = m.end()
        pieces.append(text[cursor:])
        # An opening tag with no closing tag after it (e.g. the model stopped mid-call).
        tail_open = masked.find(_OPEN, masked.rfind("</tool_call>") + 1)
        if tail_open >= 0:
            calls.append(ToolCall(name="", arguments={}, raw=text[tail_open:],
                                  error="<tool_call> was opened but never closed with </tool_call>"))
        for i, call in enumerate(calls):
            call.call_id = f"call_{i}"
        return ParsedTurn(content="".join(pieces), calls=calls)


PARSERS: dict[str, type] = {"hermes": HermesParser}


def make_parser(name: str) -> ToolCallParser:
    if name not in PARSERS:
        raise ValueError(f"unknown tool parser {name!r}; choose one of {sorted(PARSERS)}")
    return PARSERS[name]()


__all__ = ["ParsedTurn", "ToolCallParser", "HermesParser", "PARSERS", "make_parser"]
